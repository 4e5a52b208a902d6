// Runs: the list (live; search, state and tag filters, sort), one run's page (what the server saw of it, its
// name and tags, its checkpoints, its curves, live), and several runs overlaid.

import { api, enc, ApiError } from "./api.js";
import { h, clear, fmtNum, fmtInt, fmtBytes, ago, short, pill, cardLabels, ownerCell } from "./dom.js";
import { ChartGrid, COLORS } from "./plot.js";

const LIST_EVERY_MS = 3000, CURVES_EVERY_MS = 2000;
const SORTS = [["last_activity:desc", "last activity"], ["created_at:desc", "newest"], ["steps:desc", "most steps"],
  ["last_loss:asc", "lowest loss"], ["run_id:asc", "run id"]];

export function plural(n, one, many = `${one}s`) { return `${fmtInt(n)} ${n === 1 ? one : many}`; }

// The runs that match `query` (any of id, name, tags, base model, owner, session, state), `state` and `tag`,
// sorted by `sort`.
export function pick(runs, query, state, sort, tag = "") {
  const words = query.toLowerCase().split(/\s+/).filter(Boolean);
  const [key, order] = sort.split(":"), sign = order === "desc" ? -1 : 1;
  const value = (r) => (key === "last_activity" || key === "created_at" ? Date.parse(r[key]) : r[key]);
  return runs.filter((r) => (!state || r.state === state) && (!tag || (r.tags || []).includes(tag)) &&
      words.every((w) => [r.run_id, r.name || "", ...(r.tags || []), r.base_model, r.owner, r.session_id, r.state]
        .some((f) => f.toLowerCase().includes(w))))
    .sort((a, b) => {
      const x = value(a), y = value(b);
      if (x === null || x === undefined) return 1;
      if (y === null || y === undefined) return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * sign;
    });
}

export async function render(main, ctx) {
  const selected = new Set();
  const compare = h("button", { id: "compare", disabled: true, onclick: () => { location.hash = `#/compare/${[...selected].map(enc).join(",")}`; } }, "Compare selected");
  const body = h("tbody");
  const total = h("span", { class: "muted", id: "runs-total" });
  let runs = [];
  const search = h("input", { type: "search", id: "run-search", placeholder: "search name, id, tag, model, owner, state…", oninput: () => draw() });
  const state = h("select", { id: "run-state", onchange: () => draw() }, h("option", { value: "" }, "any state"),
    ["training", "idle", "unloaded", "corrupted"].map((s) => h("option", { value: s }, s)));
  const tag = h("select", { id: "run-tag", onchange: () => draw() }, h("option", { value: "" }, "any tag"));
  const sort = h("select", { id: "run-sort", onchange: () => draw() }, SORTS.map(([v, label]) => h("option", { value: v }, `sort: ${label}`)));
  const table = h("table", { id: "runs", class: "cards" }, h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", {}, "run"), h("th", {}, "base model"),
    h("th", { class: "num" }, "rank"), ctx.me.operator ? h("th", {}, "owner") : "", h("th", {}, "state"),
    h("th", { class: "num" }, "steps"), h("th", { class: "num" }, "tokens"), h("th", { class: "num" }, "loss/token"),
    h("th", {}, "last activity"))), body);
  main.append(h("div", { class: "row" }, h("h1", {}, "Training runs"), total, compare), h("div", { class: "row filters" }, search, state, tag, sort), table);
  function tagOptions() {  // every tag of the runs shown, the chosen one kept
    const chosen = tag.value, all = [...new Set(runs.flatMap((r) => r.tags || []))].sort();
    if (chosen && !all.includes(chosen)) all.unshift(chosen);
    clear(tag).append(h("option", { value: "" }, "any tag"), ...all.map((t) => h("option", { value: t }, `tag: ${t}`)));
    tag.value = chosen;
  }
  function draw() {
    const shown = pick(runs, search.value, state.value, sort.value, tag.value);
    clear(body);
    if (!runs.length) body.append(h("tr", {}, h("td", { colspan: 10, class: "muted" }, "No runs yet: create one with the tinker SDK.")));
    else if (!shown.length) body.append(h("tr", {}, h("td", { colspan: 10, class: "muted" }, "No run matches.")));
    for (const run of shown) {
      const box = h("input", { type: "checkbox", checked: selected.has(run.run_id), title: "select to compare", onchange: (e) => {
        if (e.target.checked) selected.add(run.run_id); else selected.delete(run.run_id);
        compare.disabled = selected.size < 2;
      } });
      body.append(h("tr", { dataset: { run: run.run_id } }, h("td", {}, box),
        runCell(run),
        h("td", {}, run.base_model), h("td", { class: "num" }, run.lora_rank),
        ctx.me.operator ? ownerCell(ctx.me, run.owner) : "",
        h("td", { class: "state" }, pill(run.state)), h("td", { class: "num steps" }, fmtInt(run.steps)), h("td", { class: "num" }, fmtInt(run.tokens)),
        h("td", { class: "num loss" }, fmtNum(run.last_loss)), h("td", { title: run.last_activity }, ago(run.last_activity))));
    }
    cardLabels(table);
  }
  async function refresh() {
    const data = await api("/console/runs?limit=200");
    runs = data.runs;
    tagOptions();
    total.textContent = data.total > runs.length ? `${plural(data.total, "run")} (the ${runs.length} most recently active here)` : plural(data.total, "run");
    draw();
  }
  await refresh();
  ctx.ready();
  const timer = setInterval(() => refresh().catch(() => {}), LIST_EVERY_MS);
  return () => clearInterval(timer);
}

// A run's name (its id when it has none) linking to its page, its id under a name, and its tags.
function runCell(run) {
  const link = h("a", { href: `#/runs/${enc(run.run_id)}`, class: run.name ? "run-name" : "run-name mono" }, run.name || run.run_id);
  return h("td", { class: "run" }, link, run.name ? h("div", { class: "muted mono small" }, run.run_id) : "", tagPills(run.tags));
}

function tagPills(tags) {
  return (tags || []).length ? h("div", { class: "tags" }, tags.map((t) => pill(t, "tag"))) : "";
}

// The run's name and tags, editable by its owner (PATCH /console/runs/{id}); the server's refusal shown as said.
function labelsEditor(run, onSaved) {
  const name = h("input", { id: "run-name", maxlength: 120, placeholder: "name", value: run.name || "" });
  const tags = h("input", { id: "run-tags", placeholder: "tags, comma-separated", value: (run.tags || []).join(", ") });
  const status = h("span", { id: "run-labels-status", class: "muted" });
  const save = h("button", { id: "run-labels-save", onclick: async () => {
    status.className = "muted";
    status.textContent = "saving…";
    try {
      const saved = await api(`/console/runs/${enc(run.run_id)}`, { method: "PATCH",
        body: { name: name.value, tags: tags.value.split(",").map((t) => t.trim()).filter(Boolean) } });
      name.value = saved.name || "";
      tags.value = saved.tags.join(", ");
      status.textContent = "saved";
      onSaved(saved);
    } catch (error) {
      status.className = "error";
      status.textContent = error instanceof ApiError ? error.detail : String(error);
    }
  } }, "Save");
  return h("div", { class: "row panel", id: "run-labels" }, h("label", {}, "name ", name), h("label", {}, "tags ", tags), save, status);
}

// One run's recorded calls, grown by polling with after_seq.
class Curves {
  constructor(runId) { this.runId = runId; this.points = []; this.lastSeq = 0; this.run = null; }
  async poll() {
    const data = await api(`/console/runs/${enc(this.runId)}/metrics?after_seq=${this.lastSeq}`);
    this.run = data.run;
    const c = data.calls, names = Object.keys(c.metrics);
    for (let i = 0; i < c.seq.length; i++) {
      const metrics = {};
      for (const name of names) if (c.metrics[name][i] !== null) metrics[name] = c.metrics[name][i];
      this.points.push({ seq: c.seq[i], step: c.step[i], kind: c.kind[i], finished: c.finished[i], seconds: c.seconds[i],
        tokens: c.tokens[i], total_tokens: c.total_tokens[i], metrics });
    }
    this.lastSeq = data.last_seq;
    return c.seq.length > 0;
  }
}

// RL metrics averaged over a step's forward_backward calls; an optimizer step's own metrics
const RL_KEYS = ["ratio_mean", "kl_sampler_trainer", "clip_fraction", "advantage_abs_mean", "advantage_mean"];
const IS_LR = new Set(["grad_norm", "learning_rate", "learning_rate:mean"]);

// {name: [[step, value]]} per chart, from the recorded calls: a step's forward_backward calls are summed
// (loss per token = their loss over their weight), its optim_step gives grad norm and learning rate. One pass,
// each metric name classified once (20,000 calls: ~2x quicker than Object.entries per call, for the run page's
// 300 ms budget).
export function seriesOf(points, xMode) {
  const steps = [];  // in step order: calls come in step order, so a step is the last one or new
  const byStep = new Map();
  const t0 = points.length ? points[0].finished : 0;
  const fbOther = new Map(), optOther = new Map();  // key -> whether it is charted as its own ("other") series
  let s = null;
  for (const p of points) {
    if (!s || s.step !== p.step) {
      s = byStep.get(p.step);
      if (!s) { byStep.set(p.step, s = { step: p.step, loss: 0, weight: 0, evalLoss: 0, evalWeight: 0, tokens: 0, seconds: 0, rl: null, rlN: 0, other: null, end: 0, gradNorm: undefined, lr: undefined }); steps.push(s); }
    }
    s.seconds += p.seconds;
    s.end = p.finished;
    const m = p.metrics;
    if (p.kind === "forward_backward") {
      s.loss += m.loss_sum ?? 0; s.weight += m.loss_weight ?? 0; s.tokens += p.tokens;
      for (const k in m) {
        let other = fbOther.get(k);
        if (other === undefined) fbOther.set(k, other = k.includes(":") || k.startsWith("custom/"));
        if (other) (s.other ||= {})[k] = m[k];
        else if (RL_KEYS.includes(k)) (s.rl ||= {})[k] = (s.rl[k] || 0) + m[k];
      }
      if ("ratio_mean" in m) s.rlN += 1;
    } else if (p.kind === "forward") {
      s.evalLoss += m.loss_sum ?? 0; s.evalWeight += m.loss_weight ?? 0;
    } else {
      if ("grad_norm" in m) s.gradNorm = m.grad_norm;
      const lr = m.learning_rate ?? m["learning_rate:mean"];
      if (lr !== undefined) s.lr = lr;
      for (const k in m) {
        let other = optOther.get(k);
        if (other === undefined) optOther.set(k, other = !IS_LR.has(k));
        if (other) (s.other ||= {})[k] = m[k];
      }
    }
  }
  for (let i = 1; i < steps.length; i++) if (steps[i].step < steps[i - 1].step) { steps.sort((a, b) => a.step - b.step); break; }
  const out = { loss: [], evalLoss: [], gradNorm: [], lr: [], tokensPerS: [], stepTime: [], wall: [], rl: {}, other: {} };
  let prevEnd = null;
  for (const s of steps) {
    const x = xMode === "time" ? (s.end - t0) / 60 : s.step;
    if (s.weight > 0) out.loss.push([x, s.loss / s.weight]);
    if (s.evalWeight > 0) out.evalLoss.push([x, s.evalLoss / s.evalWeight]);
    if (s.gradNorm !== undefined) out.gradNorm.push([x, s.gradNorm]);
    if (s.lr !== undefined) out.lr.push([x, s.lr]);
    if (s.tokens > 0 && s.seconds > 0) out.tokensPerS.push([x, s.tokens / s.seconds]);
    out.stepTime.push([x, s.seconds]);
    if (prevEnd !== null) out.wall.push([x, s.end - prevEnd]);
    prevEnd = s.end;
    if (s.rl) for (const k in s.rl) (out.rl[k] ||= []).push([x, s.rl[k] / Math.max(1, s.rlN)]);
    if (s.other) for (const k in s.other) (out.other[k] ||= []).push([x, s.other[k]]);
  }
  return out;
}

const RL_CHARTS = [["ratio_mean", "importance ratio exp(logp − q)", "ratio"], ["kl_sampler_trainer", "KL(sampler ‖ trainer), k1", "nats/token"],
  ["clip_fraction", "clipped share", "fraction"], ["advantage_abs_mean", "mean |advantage|", "advantage"]];

function charts(runs, opts) {
  // runs: [{name, series}] -> chart specs, one series per run on each chart
  const xLabel = opts.x === "time" ? "minutes since the first call" : "step";
  const many = runs.length > 1;
  const make = (title, unit, pick) => ({ title, unit, xLabel, scale: opts.scale, smoothing: opts.smoothing,
    series: runs.flatMap((r, i) => pick(r.series).map(([suffix, points]) => ({ name: many ? `${r.name}${suffix}` : (suffix.trim() || title), color: COLORS[(i * 2 + (suffix ? 1 : 0)) % COLORS.length], points }))) });
  const out = [
    make("loss per token", "nats/token", (s) => [["", s.loss], ...(s.evalLoss.length ? [[" (forward)", s.evalLoss]] : [])]),
    make("grad norm", "L2, before clipping", (s) => [["", s.gradNorm]]),
    make("learning rate", "per step", (s) => [["", s.lr]]),
    make("training throughput", "tokens/s on the trainer", (s) => [["", s.tokensPerS]]),
    make("step time", "s on the trainer", (s) => [["", s.stepTime]]),
    make("time between steps", "s, wall clock", (s) => [["", s.wall]]),
  ];
  for (const [key, title, unit] of RL_CHARTS) {
    if (runs.some((r) => r.series.rl[key])) out.push(make(title, unit, (s) => [["", s.rl[key] || []]]));
  }
  const others = new Set(runs.flatMap((r) => Object.keys(r.series.other)));
  for (const key of [...others].sort()) out.push(make(key, "as the loss reported it", (s) => [["", s.other[key] || []]]));
  return out;
}

function controls(opts, redraw) {
  const smoothing = h("input", { type: "range", min: 0, max: 0.99, step: 0.01, value: opts.smoothing, id: "smoothing" });
  const value = h("span", { class: "mono" }, opts.smoothing.toFixed(2));
  smoothing.addEventListener("input", () => { opts.smoothing = Number(smoothing.value); value.textContent = opts.smoothing.toFixed(2); redraw(); });
  const scale = h("select", { id: "y-scale", onchange: (e) => { opts.scale = e.target.value; redraw(); } },
    [["linear", "linear"], ["log", "log (symlog where values ≤ 0)"], ["symlog", "symlog"]].map(([v, label]) => h("option", { value: v, selected: v === opts.scale }, label)));
  const x = h("select", { id: "x-axis", onchange: (e) => { opts.x = e.target.value; redraw(); } }, h("option", { value: "step" }, "step"), h("option", { value: "time" }, "time"));
  return h("div", { class: "row panel controls" }, h("label", {}, "smoothing ", smoothing, " ", value), h("label", {}, "y scale ", scale), h("label", {}, "x axis ", x),
    h("span", { class: "muted hint" }, "drag: zoom · shift-drag: pan · wheel: zoom · double-click: all"));
}

// What the server saw of the run: its model and LoRA, its calls by kind, the learning rates its optim_step
// calls were given (first, last, range).
export function configOf(run, points) {
  const calls = {};
  const lrs = [];
  for (const p of points) {
    calls[p.kind] = (calls[p.kind] || 0) + 1;
    const lr = p.metrics.learning_rate ?? p.metrics["learning_rate:mean"];
    if (p.kind === "optim_step" && lr !== undefined) lrs.push(lr);
  }
  let schedule = "no optimizer step yet";
  if (lrs.length) {
    const lo = Math.min(...lrs), hi = Math.max(...lrs);
    schedule = lo === hi ? `${fmtNum(lo)} (constant)` : `${fmtNum(lrs[0])} → ${fmtNum(lrs[lrs.length - 1])} (range ${fmtNum(lo)}–${fmtNum(hi)})`;
  }
  const weights = run.base_fingerprint ? `${run.base_fingerprint}${run.base_revision ? ` (revision ${run.base_revision})` : " (local directory)"}` : "not recorded";
  return [["base model", run.base_model], ["base weights", weights], ["LoRA rank", String(run.lora_rank)], ["learning rate", schedule],
    ["calls recorded", Object.entries(calls).map(([k, n]) => `${k} ${fmtInt(n)}`).join(", ") || "none"],
    ["created", new Date(run.created_at).toLocaleString()], ["session", run.session_id]];
}

function runCheckpoints(list) {
  const body = h("tbody");
  for (const c of list) {
    body.append(h("tr", { dataset: { path: c.tinker_path } }, h("td", { class: "mono" }, c.tinker_path), h("td", {}, c.kind),
      h("td", { title: c.created_at }, ago(c.created_at)), h("td", { class: "num" }, fmtBytes(c.size_bytes)),
      h("td", {}, c.public ? pill("public") : pill("private", ""))));
  }
  if (!list.length) body.append(h("tr", {}, h("td", { colspan: 5, class: "muted" }, "No checkpoints saved by this run.")));
  const table = h("table", { id: "run-checkpoints", class: "cards" }, h("thead", {}, h("tr", {}, ["tinker path", "kind", "saved", "size", "visibility"]
    .map((t) => h("th", { class: t === "size" ? "num" : "" }, t)))), body);
  cardLabels(table);
  return table;
}

export async function renderRun(main, ctx, runId) {
  const curves = new Curves(runId);
  const checkpointsOf = () => api(`/console/checkpoints?run_id=${enc(runId)}&limit=200`);
  let [, saved] = await Promise.all([curves.poll(), checkpointsOf()]);
  const opts = { smoothing: 0.6, scale: "linear", x: "step" };
  const info = h("div", { class: "panel", id: "run-info" });
  const config = h("dl", { class: "panel config", id: "run-config" });
  const checkpoints = h("div", { id: "run-checkpoints-box" });
  const grid = h("div", { class: "grid", id: "charts" });
  const charts_ = new ChartGrid(grid);
  const drawInfo = () => {
    const r = curves.run;
    clear(info).append(h("div", { class: "row" }, h("strong", { id: "run-title", class: r.name ? "" : "mono" }, r.name || r.run_id),
      r.name ? h("span", { class: "muted mono" }, r.run_id) : "", tagPills(r.tags), pill(r.state), h("span", {}, r.base_model),
      h("span", {}, `rank ${r.lora_rank}`), h("span", { id: "run-steps" }, plural(r.steps, "step")), h("span", {}, plural(r.tokens, "token")),
      h("span", { class: "muted mono" }, `session ${short(r.session_id, 12)}`), h("a", { href: `#/sessions/${enc(r.session_id)}` }, "timeline")));
    clear(config).append(...configOf(r, curves.points).flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    clear(checkpoints).append(h("h2", {}, `Checkpoints (${saved.total})`), runCheckpoints(saved.checkpoints));
  };
  const redraw = () => {
    charts_.update(charts([{ name: runId, series: seriesOf(curves.points, opts.x) }], opts));
    grid.dataset.calls = String(curves.points.length);
  };
  const mine = curves.run.owner === ctx.me.owner;  // only the owner may rename (the server says so too)
  const editor = mine ? labelsEditor(curves.run, (saved) => { Object.assign(curves.run, saved); drawInfo(); }) : "";
  main.append(h("h1", {}, "Run"), info, editor, config, checkpoints, controls(opts, redraw), grid);
  drawInfo();
  redraw();
  ctx.ready();
  let ticks = 0;
  const timer = setInterval(async () => {
    try {
      const grew = await curves.poll();
      if (++ticks % 3 === 0) saved = await checkpointsOf();
      drawInfo();
      if (grew) redraw();
    } catch { /* the banner says why; next time */ }
  }, CURVES_EVERY_MS);
  return () => { clearInterval(timer); charts_.destroy(); };
}

export async function renderCompare(main, ctx, ids) {
  const all = ids.split(",").map((id) => new Curves(id));
  await Promise.all(all.map((c) => c.poll()));
  const opts = { smoothing: 0.6, scale: "linear", x: "step" };
  const grid = h("div", { class: "grid", id: "charts" });
  const charts_ = new ChartGrid(grid);
  const redraw = () => charts_.update(charts(all.map((c) => ({ name: short(c.runId, 24), series: seriesOf(c.points, opts.x) })), opts));
  main.append(h("h1", {}, `Comparing ${plural(all.length, "run")}`), controls(opts, redraw), grid);
  redraw();
  ctx.ready();
  const timer = setInterval(async () => {
    try { if ((await Promise.all(all.map((c) => c.poll()))).some(Boolean)) redraw(); } catch { /* next time */ }
  }, CURVES_EVERY_MS);
  return () => { clearInterval(timer); charts_.destroy(); };
}
