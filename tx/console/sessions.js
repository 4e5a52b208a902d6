// Sessions: the list, and one session's futures on a timeline (the spans the trace export is built from):
// one lane per training run or sampler, each operation's wait in the queue (light) and its run (solid).

import { api, enc } from "./api.js";
import { h, clear, ago, short, pill, fmtNum, cardLabels, ownerCell } from "./dom.js";
import { COLORS } from "./plot.js";

// A lane's label and order from its track id: "<session>:train:<n>" is run n, "<session>:sample:<n>" sampler n
// (numbers sorted as numbers), anything else (OpenAI-compatible sampling) after them under its own name.
export function lane(track) {
  const m = track.match(/:(train|sample):(\d+)$/);
  if (m) return { label: `${m[1] === "train" ? "run" : "sampler"} ${m[2]}`, order: [m[1] === "train" ? 0 : 1, Number(m[2]), ""] };
  return { label: track.startsWith("oai") ? `OpenAI-compatible${track.length > 3 ? ` ${track.slice(4)}` : ""}` : track, order: [2, 0, track] };
}

export function laneOrder(a, b) {
  const x = lane(a).order, y = lane(b).order;
  return x[0] - y[0] || x[1] - y[1] || (x[2] < y[2] ? -1 : x[2] > y[2] ? 1 : 0);
}

export async function render(main, ctx) {
  const data = await api("/console/sessions?limit=200");
  const body = h("tbody");
  for (const s of data.sessions) {
    body.append(h("tr", {}, h("td", { class: "mono" }, h("a", { href: `#/sessions/${enc(s.session_id)}` }, s.session_id)),
      h("td", {}, s.display_name || ""), ctx.me.operator ? ownerCell(ctx.me, s.owner) : "",
      h("td", {}, pill(s.status), s.reason ? ` ${s.reason}` : ""), h("td", { class: "num" }, s.runs), h("td", { class: "num" }, s.samplers),
      h("td", { title: s.created_at }, ago(s.created_at)), h("td", { title: s.last_heartbeat }, ago(s.last_heartbeat))));
  }
  if (!data.sessions.length) body.append(h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No sessions yet.")));
  const table = h("table", { id: "sessions", class: "cards" }, h("thead", {}, h("tr", {}, h("th", {}, "session"), h("th", {}, "name"),
      ctx.me.operator ? h("th", {}, "owner") : "", h("th", {}, "status"), h("th", { class: "num" }, "runs"),
      h("th", { class: "num" }, "samplers"), h("th", {}, "created"), h("th", {}, "last heartbeat"))), body);
  cardLabels(table);
  main.append(h("div", { class: "row" }, h("h1", {}, "Sessions"), h("span", { class: "muted" }, `${data.total} in all`)), table);
  ctx.ready();
}

export async function renderSession(main, ctx, sessionId) {
  const data = await api(`/console/sessions/${enc(sessionId)}`);
  const s = data.session;
  main.append(h("h1", {}, "Session"), h("div", { class: "panel row mono" }, h("strong", {}, s.session_id), pill(s.status),
    h("span", {}, `${s.runs} run${s.runs === 1 ? "" : "s"}, ${s.samplers} sampler${s.samplers === 1 ? "" : "s"}`), h("span", { class: "muted" }, `created ${ago(s.created_at)}`)));
  main.append(h("h2", {}, "Where the time went"), summary(data.spans));
  main.append(h("h2", {}, "Timeline"), h("p", { class: "muted" }, "Each operation: light = waiting in its queue, solid = running (a training run's lane is the trainer; a sampler's, the engines). Hover for times."),
    timeline(data.spans, main.clientWidth));
  ctx.ready();
}

function summary(spans) {
  const kinds = new Map();
  for (const s of spans) {
    const k = kinds.get(s.kind) || { n: 0, queue: 0, run: 0, failed: 0 };
    const ran = s.started ?? s.finished;
    k.n += 1; k.queue += ran - s.submitted; k.run += s.finished - ran; k.failed += s.failed ? 1 : 0;
    kinds.set(s.kind, k);
  }
  const body = h("tbody");
  for (const [kind, k] of kinds) {
    body.append(h("tr", {}, h("td", {}, kind), h("td", { class: "num" }, k.n), h("td", { class: "num" }, fmtNum((k.queue / k.n) * 1000, 3)),
      h("td", { class: "num" }, fmtNum((k.run / k.n) * 1000, 3)), h("td", { class: "num" }, fmtNum(k.queue * 1000, 4)),
      h("td", { class: "num" }, fmtNum(k.run * 1000, 4)), h("td", { class: "num" }, k.failed)));
  }
  if (!spans.length) body.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "Nothing recorded by this server process for this session.")));
  const table = h("table", { id: "time-summary", class: "cards" }, h("thead", {}, h("tr", {}, h("th", {}, "operation"), h("th", { class: "num" }, "count"),
    h("th", { class: "num" }, "mean queued (ms)"), h("th", { class: "num" }, "mean running (ms)"), h("th", { class: "num" }, "total queued (ms)"),
    h("th", { class: "num" }, "total running (ms)"), h("th", { class: "num" }, "failed"))), body);
  cardLabels(table);
  return table;
}

function timeline(spans, width) {
  const box = h("div", { class: "panel timeline", id: "timeline" });
  if (!spans.length) return box;
  const tracks = [...new Set(spans.map((s) => s.track))].sort(laneOrder);
  const kinds = [...new Set(spans.map((s) => s.kind))].sort();
  const t0 = Math.min(...spans.map((s) => s.submitted)), t1 = Math.max(...spans.map((s) => s.finished));
  // drawn at the page's width in CSS pixels: its text stays 10 px at any width
  const W = Math.max(300, Math.floor(width || 1200) - 72), left = Math.min(150, Math.round(W * 0.25)), laneH = 26, top = 8, H = top + tracks.length * laneH + 30;
  const sx = (t) => left + ((t - t0) / Math.max(t1 - t0, 1e-6)) * (W - left - 10);
  const svg = h("svg:svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H });
  tracks.forEach((track, i) => {
    svg.append(h("svg:text", { x: 4, y: top + i * laneH + 15, class: "lane", "data-track": track }, lane(track).label, h("svg:title", {}, track)),
      h("svg:line", { x1: left, x2: W - 10, y1: top + (i + 1) * laneH - 2, y2: top + (i + 1) * laneH - 2, stroke: "#eceff3" }));
  });
  for (const s of spans) {
    const y = top + tracks.indexOf(s.track) * laneH + 4, color = s.failed ? "#c23b3b" : COLORS[kinds.indexOf(s.kind) % COLORS.length];
    const ran = s.started ?? s.finished;
    const title = `${s.kind}: queued ${fmtNum((ran - s.submitted) * 1000, 3)} ms, ran ${fmtNum((s.finished - ran) * 1000, 3)} ms${s.failed ? " (failed)" : ""}`;
    svg.append(h("svg:rect", { x: sx(s.submitted), y, width: Math.max(sx(ran) - sx(s.submitted), 0.5), height: 16, fill: color, "fill-opacity": 0.25 }, h("svg:title", {}, title)));
    if (s.started !== null) svg.append(h("svg:rect", { class: "span", x: sx(ran), y, width: Math.max(sx(s.finished) - sx(ran), 1), height: 16, fill: color }, h("svg:title", {}, title)));
  }
  const axisY = top + tracks.length * laneH + 16;
  for (let i = 0; i <= 5; i++) {
    const t = t0 + ((t1 - t0) * i) / 5;
    svg.append(h("svg:text", { x: sx(t), y: axisY, "text-anchor": "middle" }, `${fmtNum(t - t0, 3)} s`));
  }
  box.append(svg, h("div", { class: "legend" }, kinds.map((k, i) => h("span", {}, h("i", { style: `background:${COLORS[i % COLORS.length]}` }), k))));
  return box;
}
