// Checkpoints: list; publish / unpublish, TTL, delete, download links, the tinker:// path to copy. The
// changes go through the SDK's own routes, which only the owner may use.

import { api, checkpointPath } from "./api.js";
import { h, clear, fmtBytes, ago, pill, copy, cardLabels, ownerCell } from "./dom.js";

export async function render(main, ctx) {
  const body = h("tbody");
  const total = h("span", { class: "muted" });
  const message = h("p", { class: "error", id: "checkpoint-error" });
  const bulk = h("button", { class: "danger", id: "delete-selected", disabled: true }, "Delete selected");
  const table = h("table", { id: "checkpoints", class: "cards" }, h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", {}, "tinker path"), h("th", {}, "kind"),
      ctx.me.operator ? h("th", {}, "owner") : "", h("th", {}, "saved"), h("th", { class: "num" }, "size"),
      h("th", {}, "expires"), h("th", {}, "visibility"), h("th", {}, ""))), body);
  main.append(h("div", { class: "row" }, h("h1", {}, "Checkpoints"), total, bulk), message, table);
  const act = async (fn) => {
    message.textContent = "";
    try { await fn(); await refresh(); } catch (error) { message.textContent = String(error.message || error); }
  };
  const selected = () => [...body.querySelectorAll("input.pick:checked")].map((box) => box.closest("tr").dataset.path);
  const showSelected = () => {
    const n = selected().length;
    bulk.disabled = !n; delete bulk.dataset.armed;
    bulk.textContent = n ? `Delete selected (${n})` : "Delete selected";
  };
  body.addEventListener("change", showSelected);
  let byPath = new Map(), count = 0;
  bulk.addEventListener("click", async () => {
    const paths = selected();
    if (!paths.length) return;
    if (!bulk.dataset.armed) {  // the confirmation names the count; it lapses after 4 s or a change of selection
      bulk.dataset.armed = "1"; bulk.textContent = `Really delete ${plural(paths.length)}?`;
      setTimeout(() => { if (bulk.dataset.armed) showSelected(); }, 4000);
      return;
    }
    delete bulk.dataset.armed; bulk.disabled = true; bulk.textContent = `Deleting ${plural(paths.length)}…`;
    message.textContent = "";
    const failed = await deleteEach(paths.map((path) => byPath.get(path)).filter(Boolean));
    for (const tr of [...body.querySelectorAll("tr[data-path]")]) {  // what went is taken off; what failed says why
      if (!paths.includes(tr.dataset.path)) continue;
      if (failed.has(tr.dataset.path)) showFailure(tr, failed.get(tr.dataset.path));
      else { tr.remove(); byPath.delete(tr.dataset.path); count -= 1; }
    }
    total.textContent = plural(count);
    if (failed.size) message.textContent = `${plural(failed.size)} not deleted: see ${failed.size === 1 ? "its row" : "their rows"}.`;
    showSelected();
  });
  async function refresh() {
    const data = await api("/console/checkpoints?limit=500");
    count = data.total; total.textContent = plural(count);
    clear(body);
    byPath = new Map(data.checkpoints.map((c) => [c.tinker_path, c]));
    if (!data.checkpoints.length) body.append(h("tr", {}, h("td", { colspan: 9, class: "muted" }, "No checkpoints yet.")));
    for (const c of data.checkpoints) body.append(row(c, ctx, act));
    cardLabels(table);
    showSelected();
  }
  await refresh();
  ctx.ready();
}

function plural(n) { return `${n} checkpoint${n === 1 ? "" : "s"}`; }

// Each checkpoint deleted as its own Delete button does (the SDK's owner-only route, which audits it), one after
// another; {tinker path: the server's words} for those that failed.
async function deleteEach(checkpoints) {
  const failed = new Map();
  for (const c of checkpoints) {
    try { await api(checkpointPath(c), { method: "DELETE" }); } catch (error) { failed.set(c.tinker_path, String(error.message || error)); }
  }
  return failed;
}

// A failed deletion on its row, still ticked (Delete selected tries it again).
function showFailure(tr, why) {
  tr.classList.add("failed");
  tr.querySelector(".row-error")?.remove();
  tr.children[1].append(h("div", { class: "error row-error" }, `not deleted: ${why}`));
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
  const pick = mine ? h("input", { type: "checkbox", class: "pick", title: "select for Delete selected" }) : "";
  return h("tr", { dataset: { path: c.tinker_path } }, h("td", { class: "select" }, pick),
    h("td", { class: "mono" }, c.tinker_path, " ", copyButton, links),
    h("td", {}, c.kind), ctx.me.operator ? ownerCell(ctx.me, c.owner) : "",
    h("td", { title: c.created_at }, ago(c.created_at)), h("td", { class: "num" }, fmtBytes(c.size_bytes)),
    h("td", { class: "expires" }, c.expires_at ? new Date(c.expires_at).toLocaleString() : "never"),
    h("td", {}, c.public ? pill("public") : pill("private", "")), actions);
}
