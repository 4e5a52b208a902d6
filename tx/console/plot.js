// Line charts drawn as SVG by hand: axes with units, gridlines, linear or log y, EMA smoothing (debiased, so
// the first points are not pulled to zero), several series overlaid with a legend, a readout on hover.

import { h, fmtNum } from "./dom.js";

const W = 600, H = 230, M = { left: 58, right: 14, top: 10, bottom: 36 };
export const COLORS = ["#2f6fde", "#d9480f", "#2b8a3e", "#ae3ec9", "#e8590c", "#0c8599", "#c2255c", "#5c940d"];

export function smooth(points, weight) {
  if (!(weight > 0)) return points;
  const out = [];
  let last = 0, n = 0;
  for (const [x, y] of points) {
    last = last * weight + (1 - weight) * y;
    n += 1;
    out.push([x, last / (1 - Math.pow(weight, n))]);
  }
  return out;
}

export function linearTicks(lo, hi, count = 5) {
  if (!(hi > lo)) { const pad = Math.abs(lo) * 0.1 || 1; lo -= pad; hi += pad; }
  const raw = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => raw <= s);
  const ticks = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
  return { lo, hi, ticks };
}

export function logTicks(lo, hi) {
  if (!(hi > lo)) { lo /= 2; hi *= 2; }
  const a = Math.floor(Math.log10(lo)), b = Math.ceil(Math.log10(hi));
  const mults = b - a <= 2 ? [1, 2, 5] : [1];
  const ticks = [];
  for (let e = a; e <= b; e++) for (const m of mults) { const t = m * Math.pow(10, e); if (t >= lo && t <= hi) ticks.push(t); }
  return { lo, hi, ticks };
}

function pathOf(points, sx, sy) {
  let d = "";
  for (let i = 0; i < points.length; i++) d += `${i ? "L" : "M"}${sx(points[i][0]).toFixed(1)} ${sy(points[i][1]).toFixed(1)}`;
  return d;
}

function nearest(points, x) {
  let lo = 0, hi = points.length - 1;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (points[mid][0] < x) lo = mid + 1; else hi = mid; }
  if (lo > 0 && Math.abs(points[lo - 1][0] - x) < Math.abs(points[lo][0] - x)) lo -= 1;
  return points[lo];
}

// series: [{name, color, points: [[x, y], ...]}] with x ascending.
export function lineChart({ title, unit, xLabel, log = false, smoothing = 0, series }) {
  const shown = series.map((s, i) => ({ ...s, color: s.color || COLORS[i % COLORS.length],
    points: s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y) && (!log || y > 0)) }))
    .filter((s) => s.points.length);
  const readout = h("span", { class: "readout" });
  const box = h("div", { class: "chart", dataset: { title, points: String(shown.reduce((n, s) => n + s.points.length, 0)) } },
    h("h3", {}, title, h("span", { class: "muted" }, unit ? ` (${unit})` : "")), readout);
  if (!shown.length) { box.append(h("p", { class: "muted" }, "no points yet")); return box; }
  const smoothed = shown.map((s) => ({ ...s, smooth: smooth(s.points, smoothing) }));
  const xs = shown.flatMap((s) => s.points.map((p) => p[0])), ys = shown.flatMap((s) => s.points.map((p) => p[1]));
  const x = linearTicks(Math.min(...xs), Math.max(...xs));
  const y = log ? logTicks(Math.min(...ys), Math.max(...ys)) : linearTicks(Math.min(...ys), Math.max(...ys));
  const iw = W - M.left - M.right, ih = H - M.top - M.bottom;
  const sx = (v) => M.left + ((v - x.lo) / (x.hi - x.lo)) * iw;
  const sy = log ? (v) => M.top + ih - ((Math.log10(v) - Math.log10(y.lo)) / (Math.log10(y.hi) - Math.log10(y.lo))) * ih
    : (v) => M.top + ih - ((v - y.lo) / (y.hi - y.lo)) * ih;
  const svg = h("svg:svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title });
  const grid = h("svg:g", { class: "grid" });
  for (const t of y.ticks) {
    grid.append(h("svg:line", { x1: M.left, x2: W - M.right, y1: sy(t), y2: sy(t) }));
    svg.append(h("svg:text", { x: M.left - 6, y: sy(t) + 3, "text-anchor": "end" }, fmtNum(t, 3)));
  }
  for (const t of x.ticks) {
    grid.append(h("svg:line", { x1: sx(t), x2: sx(t), y1: M.top, y2: M.top + ih }));
    svg.append(h("svg:text", { x: sx(t), y: M.top + ih + 14, "text-anchor": "middle" }, fmtNum(t, 4)));
  }
  svg.prepend(grid);
  svg.append(h("svg:line", { class: "axis", x1: M.left, x2: M.left, y1: M.top, y2: M.top + ih }),
    h("svg:line", { class: "axis", x1: M.left, x2: W - M.right, y1: M.top + ih, y2: M.top + ih }),
    h("svg:text", { x: M.left + iw / 2, y: H - 4, "text-anchor": "middle" }, xLabel),
    h("svg:text", { x: 12, y: M.top + ih / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${M.top + ih / 2})` },
      `${unit || ""}${log ? " (log)" : ""}`));
  for (const s of smoothed) {
    if (smoothing > 0) svg.append(h("svg:path", { d: pathOf(s.points, sx, sy), fill: "none", stroke: s.color, "stroke-opacity": 0.22, "stroke-width": 1 }));
    svg.append(h("svg:path", { d: pathOf(s.smooth, sx, sy), fill: "none", stroke: s.color, "stroke-width": 1.6, class: "series", "data-name": s.name }));
  }
  const cursor = h("svg:line", { x1: -10, x2: -10, y1: M.top, y2: M.top + ih, stroke: "#9aa3b2", "stroke-dasharray": "3 3" });
  svg.append(cursor);
  svg.addEventListener("mousemove", (event) => {
    const r = svg.getBoundingClientRect(), px = ((event.clientX - r.left) / r.width) * W;
    const at = x.lo + ((px - M.left) / iw) * (x.hi - x.lo);
    const parts = smoothed.map((s) => { const p = nearest(s.smooth, at); return `${s.name}: ${fmtNum(p[1])}`; });
    const p0 = nearest(smoothed[0].smooth, at);
    cursor.setAttribute("x1", sx(p0[0])); cursor.setAttribute("x2", sx(p0[0]));
    readout.textContent = `${xLabel} ${fmtNum(p0[0], 6)} · ${parts.join(" · ")}`;
  });
  svg.addEventListener("mouseleave", () => { readout.textContent = ""; cursor.setAttribute("x1", -10); cursor.setAttribute("x2", -10); });
  box.append(svg);
  if (shown.length > 1) {
    box.append(h("div", { class: "legend" }, shown.map((s) => h("span", {}, h("i", { style: `background:${s.color}` }), s.name))));
  }
  return box;
}
