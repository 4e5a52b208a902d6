// Small DOM helpers. Text always goes in as text (textContent), never as HTML: run names, metadata and
// samples are other people's strings.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElementNS(tag.startsWith("svg:") ? "http://www.w3.org/2000/svg" : "http://www.w3.org/1999/xhtml",
    tag.replace(/^svg:/, ""));
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style") el.style.cssText = value;  // through the CSSOM: the page's CSP allows no inline style
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); return el; }

export function fmtNum(x, digits = 4) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  const a = Math.abs(x);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return x.toExponential(2);
  return Number(x.toPrecision(digits)).toString();
}

export function fmtInt(x) { return x === null || x === undefined ? "–" : Math.round(x).toLocaleString("en-US"); }

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

export function ago(iso) {
  const s = (Date.now() - new Date(iso).getTime()) / 1000;
  if (s < 60) return `${Math.max(0, Math.round(s))} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return `${Math.round(s / 86400)} d ago`;
}

export function short(id, n = 10) { return id.length > n ? id.slice(0, n) + "…" : id; }

// A key's owner as the operator named it (--key-label), else the start of its owner id (in full on hover).
export function ownerName(me, owner) { return (me.labels || {})[owner] || short(owner, 8); }

export function ownerCell(me, owner) {
  const label = (me.labels || {})[owner];
  return h("td", { class: label ? "owner labelled" : "owner mono", title: owner }, label || short(owner, 8));
}

export function pill(text, cls = text) { return h("span", { class: `pill ${cls}` }, text); }

export async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
  } catch {
    const field = h("textarea", {}, text);
    document.body.append(field); field.select(); document.execCommand("copy"); field.remove();
  }
  const note = h("span", { class: "copied" }, " copied");
  button.after(note);
  setTimeout(() => note.remove(), 1500);
}

// Each body cell labelled with its column's heading (data-label): a narrow page shows a `table.cards` as one
// card per row, each value beside its heading, instead of a table wider than the screen.
export function cardLabels(table) {
  const heads = [...table.querySelectorAll("thead th")].map((th) => th.textContent);
  for (const tr of table.querySelectorAll("tbody tr")) {
    [...tr.children].forEach((td, i) => { if (heads[i] && td.colSpan === 1) td.dataset.label = heads[i]; });
  }
}
