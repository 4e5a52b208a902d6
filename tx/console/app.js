// The console's shell: sign-in with an API key, the navigation, and a hash router (#/runs, #/runs/<id>,
// #/compare/<id>,<id>, #/checkpoints, #/sessions, #/sessions/<id>, #/engines, #/playground).
// A page's `render(main, ctx, ...args)` fills `main` and may return a function that stops its timers.
// Once a page has drawn its data, body[data-ready] names it; window.txReadyMs holds the time from the
// navigation's start to the first page drawn (what the load-time test reads).
// When the server cannot be reached (or stops taking the key), a banner under the header says so and since
// when, what the page shows is marked stale (body.stale), and a page that could not load is tried again with
// backoff (1 s, doubling to 30 s); the pages' own polls resume their live updates once the server answers.
// While the trainer loads a base model into memory, a line under the header says which and how far
// (`/api/v1/healthz`'s `loading`, asked every LOADING_EVERY_MS).

import { api, apiKey, setKey, ApiError, connection, dropEarly } from "./api.js";
import { h, clear, ownerName } from "./dom.js";
import * as runs from "./runs.js";
import * as checkpoints from "./checkpoints.js";
import * as sessions from "./sessions.js";
import * as engines from "./engines.js";
import * as playground from "./playground.js";

const ROUTES = [
  [/^#\/runs\/(.+)$/, "runs", runs.renderRun],
  [/^#\/compare\/(.+)$/, "runs", runs.renderCompare],
  [/^#\/checkpoints$/, "checkpoints", checkpoints.render],
  [/^#\/sessions\/(.+)$/, "sessions", sessions.renderSession],
  [/^#\/sessions$/, "sessions", sessions.render],
  [/^#\/engines$/, "engines", engines.render],
  [/^#\/playground$/, "playground", playground.render],
  [/^.*$/, "runs", runs.render],
];
const main = document.getElementById("main");
let stop = null;
let me = null;
let retry = null, retryMs = 1000;
const ME = "tx.console.me";
const RETRY_MAX_MS = 30000;
const LOADING_EVERY_MS = 3000;

function clock(date) { return date.toTimeString().slice(0, 8); }

function showConnection() {
  const banner = document.getElementById("banner");
  const down = connection.downSince, refused = connection.refused;
  document.body.classList.toggle("stale", Boolean(down || refused));
  banner.hidden = !(down || refused);
  banner.textContent = down ? `Server unreachable since ${clock(down)}, retrying. What this page shows is from before then.`
    : refused ? `The server no longer takes this key (${refused}). Sign out and in with a valid key; what this page shows is stale.` : "";
  if (!down && retry) { clearTimeout(retry); retry = null; retryMs = 1000; route(); }  // back: load the page that failed
}
window.addEventListener("tx-connection", showConnection);

async function showLoading() {
  const line = document.getElementById("loading");
  try {
    const loads = (await api("/healthz")).loading || [];
    line.hidden = !loads.length;
    line.textContent = loads.map((l) => `Loading ${l.model} into memory: ${l.fraction === null ? "reading its files"
      : `${Math.floor(100 * l.fraction)}% of its weights`} (${Math.round(l.seconds)} s)`).join(" · ");
  } catch { /* the connection banner says why */ }
  setTimeout(showLoading, LOADING_EVERY_MS);
}

export function ready(page) {
  if (window.txReadyMs === undefined) window.txReadyMs = performance.now();
  document.body.dataset.ready = page;
}

function signIn(message) {
  clear(document.getElementById("nav")); clear(document.getElementById("who"));
  const input = h("input", { type: "password", id: "api-key", placeholder: "tml-…", autocomplete: "off" });
  const error = h("p", { class: "error", id: "signin-error" }, message || "");
  const form = h("form", { class: "panel signin", id: "signin" },
    h("h1", {}, "Sign in"), h("p", { class: "muted" }, "Your tx API key (the one your scripts use as TINKER_API_KEY). " +
      "It stays in this browser tab."), input, h("button", { class: "primary", type: "submit" }, "Sign in"), error);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!input.value.trim()) { error.textContent = "Enter an API key first."; input.focus(); return; }
    sessionStorage.removeItem(ME);
    setKey(input.value.trim());
    await start();
  });
  clear(main).append(form);
  input.focus();
  ready("signin");
}

function shell() {
  const nav = clear(document.getElementById("nav"));
  const pages = [["runs", "Runs"], ["checkpoints", "Checkpoints"], ["sessions", "Sessions"]];
  if (me.engines) pages.push(["engines", "Engines"]);
  pages.push(["playground", "Playground"]);
  for (const [id, label] of pages) nav.append(h("a", { href: `#/${id}`, id: `nav-${id}` }, label));
  const who = clear(document.getElementById("who"));
  who.append(h("span", { title: me.owner, id: "who-key" }, `key ${ownerName(me, me.owner)}`), me.operator ? h("span", { class: "pill public" }, "operator") : "",
    h("button", { id: "sign-out", onclick: () => { setKey(null); sessionStorage.removeItem(ME); me = null; signIn(); } }, "Sign out"));
}

async function route() {
  if (!me) return;
  if (stop) { stop(); stop = null; }
  if (retry) { clearTimeout(retry); retry = null; }
  delete document.body.dataset.ready;
  const hash = location.hash || "#/runs";
  for (const [pattern, page, render] of ROUTES) {
    const match = hash.match(pattern);
    if (!match) continue;
    for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.id === `nav-${page}`);
    clear(main);
    try {
      stop = (await render(main, { me, ready: () => ready(page) }, ...match.slice(1).map(decodeURIComponent))) || null;
      retryMs = 1000;
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) return signIn("That key was refused: " + error.detail);
      main.append(h("p", { class: "error" }, String(error.message || error)));
      if (error instanceof ApiError && error.status === 0) {  // unreachable: try this page again, less and less often
        main.append(h("p", { class: "muted", id: "retrying" }, `Trying again in ${Math.round(retryMs / 1000)} s.`));
        retry = setTimeout(route, retryMs);
        retryMs = Math.min(retryMs * 2, RETRY_MAX_MS);
      }
      ready(page);
    } finally {
      dropEarly();  // early.js's answers are for the first page only
    }
    return;
  }
}

async function start() {
  if (!apiKey()) return signIn();
  const fresh = api("/console/me");  // who this key is; the copy kept from the last load draws the page meanwhile
  const kept = sessionStorage.getItem(ME);
  if (kept) {
    me = JSON.parse(kept);
    fresh.then((latest) => { if (JSON.stringify(latest) !== kept) { sessionStorage.setItem(ME, JSON.stringify(latest)); me = latest; shell(); route(); } },
      (error) => { if (error instanceof ApiError && error.status === 401) { setKey(null); signIn("That key was refused: " + error.detail); } });
  } else {
    try {
      me = await fresh;
    } catch (error) {
      if (!(error instanceof ApiError) || error.status !== 0) setKey(null);  // an unreachable server keeps the key
      return signIn(error instanceof ApiError ? `Sign-in failed${error.status ? ` (${error.status})` : ""}: ${error.detail}` : String(error));
    }
    sessionStorage.setItem(ME, JSON.stringify(me));
  }
  shell();
  await route();
}

window.addEventListener("hashchange", route);
start();
showLoading();
