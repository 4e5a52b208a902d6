// Engines (operator keys): per base model, each engine's state, the weight versions it holds, its queue,
// tokens/s and restarts; the trainer's GPU memory when it has one; then every key's use of its quotas
// (GET /tx/usage, tx/core/quotas.py). Refreshed every 2 s.

import { api } from "./api.js";
import { h, clear, fmtNum, fmtInt, fmtBytes, pill, cardLabels, ownerCell } from "./dom.js";

export async function render(main, ctx) {
  const body = h("div", { id: "engines" });
  main.append(h("h1", {}, "Inference engines"), body);
  async function refresh() {
    const [data, usage] = await Promise.all([api("/console/engines"), api("/tx/usage")]);
    clear(body);
    const mem = data.gpu_memory;
    body.append(h("div", { class: "panel row" }, h("span", {}, `restarts, all engines: ${data.restarts}`),
      mem ? h("span", {}, "trainer GPU memory in use ", h("span", { class: "bar" }, h("span", { style: `width:${(100 * (mem.total - mem.free)) / mem.total}%` })),
        ` ${fmtBytes(mem.total - mem.free)} of ${fmtBytes(mem.total)}`) : h("span", { class: "muted" }, "trainer on CPU")));
    for (const group of data.groups) {
      const rows = group.engines.map((e) => h("tr", { dataset: { engine: e.name } }, h("td", { class: "mono" }, e.name), h("td", {}, pill(e.state)),
        h("td", { class: "mono" }, e.pid ?? "–"), h("td", { class: "mono versions" }, e.weight_versions.length ? e.weight_versions.join(", ") : "none"),
        h("td", { class: "num" }, e.running), h("td", { class: "num" }, e.waiting), h("td", { class: "num" }, e.tokens_per_s === null ? "–" : fmtNum(e.tokens_per_s, 3)),
        h("td", { class: "num" }, fmtInt(e.generated_tokens)), h("td", { class: "num" }, e.restarts), h("td", {}, e.transport || "–"),
        h("td", {}, e.device || "–"), h("td", { class: "error" }, e.problem || "")));
      body.append(h("div", { class: "panel" }, h("div", { class: "row" }, h("h2", {}, group.base_model), pill(group.state)),
        h("table", { class: "cards" }, h("thead", {}, h("tr", {}, ["engine", "state", "pid", "weight versions", "running", "waiting", "tokens/s", "tokens", "restarts", "transport", "device", ""]
          .map((t, i) => h("th", { class: i >= 4 && i <= 8 ? "num" : "" }, t)))), h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 12, class: "muted" }, "no engines"))))));
    }
    body.append(usagePanel(usage, ctx.me));
    for (const table of body.querySelectorAll("table.cards")) cardLabels(table);
  }
  await refresh();
  ctx.ready();
  const timer = setInterval(() => refresh().catch(() => {}), 2000);
  return () => clearInterval(timer);
}

// Every key holding something (owner ids, busiest first), each quota's use against its limit.
const USAGE = [["sessions", "sessions"], ["runs", "runs"], ["lora_rank", "LoRA rank"], ["queued_training_bytes", "queued bytes"],
  ["samples_in_flight", "samples in flight"], ["checkpoint_bytes", "checkpoint bytes"], ["custom_losses", "custom losses"]];

function usagePanel(usage, me) {
  const cell = (key, quota) => {
    const used = key[quota], limit = usage.limits[quota];
    const text = quota.endsWith("_bytes") ? `${fmtBytes(used)} / ${fmtBytes(limit)}` : `${fmtInt(used)} / ${fmtInt(limit)}`;
    return h("td", { class: used >= limit ? "num error" : "num", title: usage.settings[quota] }, text);
  };
  const rows = usage.keys.map((key) => h("tr", { dataset: { owner: key.owner } }, (me.labels || {})[key.owner] ? ownerCell(me, key.owner) : h("td", { class: "mono" }, key.owner),
    USAGE.map(([quota]) => cell(key, quota)), h("td", { class: "num" }, fmtInt(key.trained_tokens)), h("td", { class: "num" }, fmtInt(key.sampled_tokens))));
  const heads = ["key (label or owner id)", ...USAGE.map(([, label]) => label), "trained tokens", "sampled tokens"];
  return h("div", { class: "panel", id: "usage" }, h("h2", {}, "Keys: quota use (used / limit)"),
    h("table", { class: "cards" }, h("thead", {}, h("tr", {}, heads.map((t, i) => h("th", { class: i ? "num" : "" }, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: heads.length, class: "muted" }, "no key holds anything")))));
}
