// Checkpoints: list; publish / unpublish, TTL, delete, download links, the tinker:// path to copy. The
// changes go through the SDK's own routes, which only the owner may use.

import { api, checkpointPath } from "./api.js";
import { h, clear, fmtBytes, ago, short, pill, copy, cardLabels } from "./dom.js";

export async function render(main, ctx) {
  const body = h("tbody");
  const total = h("span", { class: "muted" });
  const message = h("p", { class: "error", id: "checkpoint-error" });
  const table = h("table", { id: "checkpoints", class: "cards" }, h("thead", {}, h("tr", {}, h("th", {}, "tinker path"), h("th", {}, "kind"),
      ctx.me.operator ? h("th", {}, "owner") : "", h("th", {}, "saved"), h("th", { class: "num" }, "size"),
      h("th", {}, "expires"), h("th", {}, "visibility"), h("th", {}, ""))), body);
  main.append(h("div", { class: "row" }, h("h1", {}, "Checkpoints"), total), message, table);
  const act = async (fn) => {
    message.textContent = "";
    try { await fn(); await refresh(); } catch (error) { message.textContent = String(error.message || error); }
  };
  async function refresh() {
    const data = await api("/console/checkpoints?limit=500");
    total.textContent = `${data.total} checkpoint${data.total === 1 ? "" : "s"}`;
    clear(body);
    if (!data.checkpoints.length) body.append(h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No checkpoints yet.")));
    for (const c of data.checkpoints) body.append(row(c, ctx, act));
    cardLabels(table);
  }
  await refresh();
  ctx.ready();
}

function row(c, ctx, act) {
  const mine = c.owner === ctx.me.owner;
  const path = checkpointPath(c);
  const copyButton = h("button", { class: "copy", title: "copy the tinker:// path" }, "copy");
  copyButton.addEventListener("click", () => copy(c.tinker_path, copyButton));
  const actions = h("td", { class: "row actions" });
  const links = h("div", { class: "links" });
  if (mine) {
    if (c.kind !== "external_weights") {
      actions.append(c.public
        ? h("button", { class: "unpublish", onclick: () => act(() => api(`${path}/publish`, { method: "DELETE" })) }, "Unpublish")
        : h("button", { class: "publish", onclick: () => act(() => api(`${path}/publish`, { method: "POST" })) }, "Publish"));
    } else {
      actions.append(h("button", { class: "links-button", onclick: () => act(async () => {
        const data = await api(`${path}/external_weights_urls`);
        clear(links).append(...Object.entries(data.urls).map(([name, url]) => h("div", {}, h("a", { href: url, download: name }, name))),
          h("div", { class: "muted" }, `links expire ${new Date(data.expires).toLocaleString()}`));
      }) }, "Download links"));
    }
    const ttl = h("input", { type: "number", min: 1, placeholder: "seconds", class: "ttl" });
    actions.append(ttl, h("button", { class: "set-ttl", onclick: () => act(() => api(`${path}/ttl`, { method: "PUT", body: { ttl_seconds: ttl.value ? Number(ttl.value) : null } })) }, "Set TTL"));
    const del = h("button", { class: "danger delete" }, "Delete");
    del.addEventListener("click", () => {
      if (del.dataset.armed) return act(() => api(path, { method: "DELETE" }));
      del.dataset.armed = "1"; del.textContent = "Really delete?";
      setTimeout(() => { delete del.dataset.armed; del.textContent = "Delete"; }, 4000);
    });
    actions.append(del);
  } else {
    actions.append(h("span", { class: "muted" }, "another key's"));
  }
  return h("tr", { dataset: { path: c.tinker_path } },
    h("td", { class: "mono" }, c.tinker_path, " ", copyButton, links),
    h("td", {}, c.kind), ctx.me.operator ? h("td", { class: "mono", title: c.owner }, short(c.owner, 8)) : "",
    h("td", { title: c.created_at }, ago(c.created_at)), h("td", { class: "num" }, fmtBytes(c.size_bytes)),
    h("td", { class: "expires" }, c.expires_at ? new Date(c.expires_at).toLocaleString() : "never"),
    h("td", {}, c.public ? pill("public") : pill("private", "")), actions);
}
