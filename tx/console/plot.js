// Line charts drawn by uPlot (vendored beside this file: uPlot.iife.min.js and uPlot.min.css, v1.6.32, MIT,
// uPlot.LICENSE.txt; loaded from this server like the rest). Each series is drawn twice: its raw values (light)
// and an EMA of them (solid; debiased, so the first points are not pulled to zero). Drag to zoom into steps,
// shift-drag to pan, the wheel to zoom around the cursor, double-click to see everything again; the legend under
// the plot is the cursor's readout (raw and smoothed values at the hovered step). y scale: linear (default),
// log (only when every value is > 0; otherwise symlog) or symlog (asinh: zero and negative values keep their
// place). Nothing finite is dropped. A series with few points draws each point, so one point is visible.
// A live update replaces the data in place: the zoom, the cursor and its readout stay.

import { h, fmtNum } from "./dom.js";

const uPlot = window.uPlot;
const HEIGHT = 220, DOTS_UNDER = 120;
// Okabe & Ito's palette: told apart with every common kind of colour blindness.
export const COLORS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#7A4F9A", "#4D4D4D"];

export function linearTicks(lo, hi, count = 5) {
  if (!Number.isFinite(lo) || !Number.isFinite(hi)) return { lo, hi, ticks: [] };
  if (!(hi > lo)) { const pad = Math.abs(lo) * 0.1 || 1; lo -= pad; hi += pad; }
  const raw = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => raw <= s);
  const ticks = [], first = Math.ceil(lo / step);
  for (let i = 0; i <= 4 * count; i++) {  // by index: a step below the values' precision never stalls
    const t = Number(((first + i) * step).toPrecision(12));
    if (t > hi + step * 1e-9) break;
    ticks.push(t);
  }
  return { lo, hi, ticks };
}

// Ticks for a log or symlog axis: plain linear ticks when the range is under a decade and a half (5.6-7.9 gets
// 6, 6.5, 7, 7.5), else 1-2-5 per decade (and 0 for symlog), thinned to about `count` labels.
export function curvedTicks(lo, hi, count, symlog) {
  const mags = (a, b) => Math.log10(Math.max(a, b) / Math.max(Math.min(a, b), 1e-300));
  if ((lo > 0 && mags(lo, hi) < 1.2) || (hi < 0 && mags(-hi, -lo) < 1.2)) return linearTicks(lo, hi, count).ticks.filter((t) => t >= lo && t <= hi);
  const out = symlog && lo <= 0 && hi >= 0 ? [0] : [];
  const decades = (a, b, sign) => {  // magnitudes in [a, b], a > 0
    const e0 = Math.floor(Math.log10(a)), e1 = Math.ceil(Math.log10(b)), every = Math.max(1, Math.ceil((e1 - e0) / count));
    const mults = e1 - e0 <= 2 ? [1, 2, 5] : [1];
    for (let e = e0; e <= e1; e++) {
      if ((e - e0) % every) continue;
      for (const m of mults) { const t = Number((m * Math.pow(10, e)).toPrecision(6)); if (t >= a && t <= b) out.push(sign * t); }
    }
  };
  const floor = symlog ? Math.max(Math.abs(lo), Math.abs(hi)) * 1e-6 : 0;
  if (hi > 0) decades(Math.max(lo, floor, 1e-300), hi, 1);
  if (lo < 0) decades(Math.max(-hi, floor, 1e-300), -lo, -1);
  return out.sort((a, b) => a - b);
}

function alpha(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${n >> 16}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

function download(href, name) {
  const a = h("a", { href, download: name });
  document.body.append(a);
  a.click();
  a.remove();
}

function ascending(points) {
  for (let i = 1; i < points.length; i++) if (!(points[i][0] > points[i - 1][0])) return false;
  return true;
}

// The points whose x and y are finite: the same array when all are (the usual case; no copy).
function finite(points) {
  for (const [x, y] of points) {
    if (!Number.isFinite(x) || !Number.isFinite(y)) return points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
  }
  return points;
}

// {xs, columns: [[y | null]], series: [{label, color, raw}], counts, min, max} from the series' own points
// (x ascending), on one x axis: the union of their xs. Each series' raw column and its EMA (debiased:
// ema_n / (1 - weight^n)). A lone series in x order (most charts) is its own axis: no union to sort. Plain loops,
// no [x, y] pairs made: the run page's first draw runs this before the JIT has warmed (20,000 calls: ~80 ms of
// its 7 charts, map/forEach and a Set of xs a chart; ~20 ms now).
function align(series, smoothing) {
  const shown = series.map((s) => ({ ...s, points: finite(s.points) }));
  const own = shown.length === 1 && ascending(shown[0].points);
  let xs, at = null;
  if (own) {
    const points = shown[0].points;
    xs = new Array(points.length);
    for (let i = 0; i < points.length; i++) xs[i] = points[i][0];
  } else {
    xs = [...new Set(shown.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
    at = new Map(xs.map((x, i) => [x, i]));
  }
  const columns = [], out = [], counts = [];
  let min = Infinity, max = -Infinity;
  for (const s of shown) {
    const points = s.points, raw = new Array(xs.length).fill(null), smoothed = new Array(xs.length).fill(null);
    let ema = 0;
    for (let i = 0; i < points.length; i++) {
      const y = points[i][1], k = at ? at.get(points[i][0]) : i;
      raw[k] = y;
      if (y < min) min = y;
      if (y > max) max = y;
      ema = ema * smoothing + (1 - smoothing) * y;
      smoothed[k] = smoothing > 0 ? ema / (1 - Math.pow(smoothing, i + 1)) : y;
    }
    columns.push(raw, smoothed);
    out.push({ label: `${s.name} raw`, color: s.color, raw: true }, { label: s.name, color: s.color, raw: false });
    counts.push(points.length, points.length);
  }
  return { xs, columns, series: out, counts, min, max, total: shown.reduce((n, s) => n + s.points.length, 0) };
}

// One chart, kept across live updates: `update(spec)` with spec = {title, unit, xLabel, scale, smoothing,
// series: [{name, color, points: [[x, y], ...]}]}.
export class Chart {
  constructor(title) {
    this.title = title;
    this.u = null;
    this.zoomed = false;
    this.signature = "";
    this.unit = h("span", { class: "muted" });
    this.note = h("span", { class: "muted scale-note" });
    this.plot = h("div", { class: "plot" });
    const tools = h("span", { class: "tools" }, this.note,
      h("button", { class: "csv", title: "the chart's values as CSV", onclick: () => download(this.csvHref(), `${this.title}.csv`) }, "CSV"),
      h("button", { class: "png", title: "the chart as a PNG image", onclick: () => download(this.png(), `${this.title}.png`) }, "PNG"));
    this.el = h("div", { class: "chart", dataset: { title, points: "0" } }, h("div", { class: "chart-head" }, h("h3", {}, title, this.unit), tools), this.plot);
    Object.defineProperty(this.el, "txChart", { value: this });  // for tests; not enumerable, so never serialized
    this.resize = new ResizeObserver(() => {
      const width = this.width();
      if (this.u && width && Math.abs(width - this.u.width) > 1) this.u.setSize({ width, height: HEIGHT });
    });
    this.resize.observe(this.el);
  }

  width() { return Math.floor(this.plot.clientWidth); }

  update(spec) {
    this.spec = spec;
    this.unit.textContent = spec.unit ? ` (${spec.unit})` : "";
    const data = align(spec.series, spec.smoothing);
    this.data = data;
    this.el.dataset.points = String(data.total);
    const scale = spec.scale === "log" && !(data.min > 0) ? "symlog" : spec.scale;
    this.note.textContent = scale !== spec.scale ? "symlog: values ≤ 0" : "";
    if (!data.total) {
      this.destroyPlot();
      this.plot.replaceChildren(h("p", { class: "muted empty" }, "no points yet"));
      return;
    }
    const signature = JSON.stringify([scale, spec.xLabel, data.series.map((s) => [s.label, s.color])]);
    const columns = [data.xs, ...data.columns];
    this.counts = [0, ...data.counts];
    this.linthresh = Math.max(Math.abs(data.min), Math.abs(data.max), 1e-300) * 1e-3;
    if (this.u && signature === this.signature) {
      this.u.setData(columns, !this.zoomed);
      if (this.zoomed) this.u.redraw();  // setData without resetting the scales draws nothing by itself
    } else {
      this.destroyPlot();
      this.plot.replaceChildren();
      this.signature = signature;
      this.zoomed = false;
      this.u = new uPlot(this.options(spec, data, scale), columns, this.plot);
    }
  }

  options(spec, data, scale) {
    const value = (u, v) => (v === null || v === undefined ? "–" : fmtNum(v));
    const series = [{ label: spec.xLabel, value: (u, v) => (v === null || v === undefined ? "–" : fmtNum(v, 6)) },
      ...data.series.map((s) => ({
        label: s.label, stroke: s.raw ? alpha(s.color, 0.35) : s.color, width: s.raw ? 1 : 1.6, spanGaps: true, value,
        points: { show: (u, i) => this.counts[i] <= DOTS_UNDER || this.counts[i] === 1, size: s.raw ? 5 : 4, fill: s.raw ? s.color : "#fff",
          stroke: s.color },
      }))];
    const y = { auto: true, range: (u, lo, hi) => this.range(lo, hi, scale) };
    if (scale === "log") Object.assign(y, { distr: 3, log: 10 });
    if (scale === "symlog") Object.assign(y, { distr: 4, asinh: this.linthresh });
    const ticks = (u, axis, lo, hi) => {
      const count = Math.max(3, Math.round(u.bbox.height / devicePixelRatio / 45));
      const t = scale === "linear" ? linearTicks(lo, hi, count).ticks.filter((v) => v >= lo && v <= hi) : curvedTicks(lo, hi, count, scale === "symlog");
      this.el.dataset.yticks = String(t.length);
      return t;
    };
    return {
      width: this.width() || 400, height: HEIGHT, series, legend: { live: true },
      scales: { x: { time: false }, y },
      axes: [{ label: spec.xLabel, labelSize: 20, size: 36, values: (u, vals) => vals.map((v) => fmtNum(v, 6)) },
        { label: `${spec.unit || ""}${scale === "linear" ? "" : ` (${scale})`}`, labelSize: 18, size: 56, splits: ticks,
          values: (u, vals) => vals.map((v) => fmtNum(v, 3)) }],
      cursor: { drag: { x: true, y: false, setScale: true }, bind: { mousedown: this.pan(), dblclick: (u, t, handler) => (e) => { this.zoomed = false; return handler(e); } } },
      hooks: { setSelect: [(u) => { if (u.select.width > 0) this.zoomed = true; }], ready: [(u) => this.wheel(u)] },
    };
  }

  range(lo, hi, scale) {
    if (lo === null || hi === null) return [0, 1];
    if (scale === "log") {
      if (hi <= lo) return [lo / 2, hi * 2];
      const pad = Math.pow(hi / lo, 0.05);
      return [lo / pad, hi * pad];
    }
    if (hi <= lo) { const pad = Math.abs(lo) * 0.1 || 1; return [lo - pad, hi + pad]; }
    const pad = (hi - lo) * 0.05;
    return [lo - pad, hi + pad];
  }

  // shift-drag pans along x; a plain drag is uPlot's own zoom
  pan() {
    return (u, target, handler) => (e) => {
      if (!e.shiftKey) return handler(e);
      e.preventDefault();
      const x0 = e.clientX, { min, max } = u.scales.x, perPx = (max - min) / u.over.clientWidth;
      const move = (m) => { const dx = (m.clientX - x0) * perPx; this.zoomed = true; u.setScale("x", { min: min - dx, max: max - dx }); };
      const up = () => { document.removeEventListener("mousemove", move); document.removeEventListener("mouseup", up); };
      document.addEventListener("mousemove", move);
      document.addEventListener("mouseup", up);
      return null;
    };
  }

  wheel(u) {
    u.over.addEventListener("wheel", (e) => {
      e.preventDefault();
      const { min, max } = u.scales.x, at = u.posToVal(e.offsetX, "x"), f = e.deltaY < 0 ? 0.8 : 1.25;
      this.zoomed = true;
      u.setScale("x", { min: at - (at - min) * f, max: at + (max - at) * f });
    }, { passive: false });
  }

  csv() {
    const d = this.data, quote = (s) => `"${String(s).replaceAll('"', '""')}"`;
    const lines = [[this.spec.xLabel, ...d.series.map((s) => s.label)].map(quote).join(",")];
    d.xs.forEach((x, i) => lines.push([x, ...d.columns.map((c) => (c[i] === null ? "" : c[i]))].join(",")));
    return lines.join("\n") + "\n";
  }

  csvHref() { return `data:text/csv;charset=utf-8,${encodeURIComponent(this.csv())}`; }

  // the plot (axes and lines) under the chart's title, on white
  png() {
    const source = this.u ? this.u.ctx.canvas : null, ratio = devicePixelRatio || 1, head = Math.round(28 * ratio);
    const canvas = document.createElement("canvas");
    canvas.width = source ? source.width : 400;
    canvas.height = (source ? source.height : 0) + head;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.fillStyle = "#1d2330"; ctx.font = `${Math.round(14 * ratio)}px system-ui, sans-serif`;
    ctx.fillText(`${this.title}${this.unit.textContent}`, 8 * ratio, 19 * ratio);
    if (source) ctx.drawImage(source, 0, head);
    return canvas.toDataURL("image/png");
  }

  destroyPlot() { if (this.u) { this.u.destroy(); this.u = null; this.signature = ""; } }

  destroy() { this.destroyPlot(); this.resize.disconnect(); }
}

// The charts of a page, by title: an update keeps each chart that is still there (its zoom and readout), adds
// new ones in order and drops the ones gone.
export class ChartGrid {
  constructor(el) { this.el = el; this.charts = new Map(); }

  update(specs) {
    const seen = new Set();
    specs.forEach((spec, i) => {
      seen.add(spec.title);
      let chart = this.charts.get(spec.title);
      if (!chart) this.charts.set(spec.title, chart = new Chart(spec.title));
      if (this.el.children[i] !== chart.el) this.el.insertBefore(chart.el, this.el.children[i] || null);
      chart.update(spec);
    });
    for (const [title, chart] of this.charts) {
      if (!seen.has(title)) { chart.destroy(); chart.el.remove(); this.charts.delete(title); }
    }
  }

  destroy() { for (const chart of this.charts.values()) chart.destroy(); this.charts.clear(); }
}
