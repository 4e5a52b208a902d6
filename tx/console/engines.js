// Engines (operator keys): per base model, each engine's state, the weight versions it holds, its queue,
// tokens/s and restarts; the trainer's GPU memory when it has one. Refreshed every 2 s.

import { api } from "./api.js";
import { h, clear, fmtNum, fmtInt, fmtBytes, pill } from "./dom.js";

export async function render(main, ctx) {
  const body = h("div", { id: "engines" });
  main.append(h("h1", {}, "Inference engines"), body);
  async function refresh() {
    const data = await api("/console/engines");
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
        h("table", {}, h("thead", {}, h("tr", {}, ["engine", "state", "pid", "weight versions", "running", "waiting", "tokens/s", "tokens", "restarts", "transport", "device", ""]
          .map((t, i) => h("th", { class: i >= 4 && i <= 8 ? "num" : "" }, t)))), h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 12, class: "muted" }, "no engines"))))));
    }
  }
  await refresh();
  ctx.ready();
  const timer = setInterval(() => refresh().catch(() => {}), 2000);
  return () => clearInterval(timer);
}
