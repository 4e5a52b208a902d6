// The console talks to tx's own JSON routes with the API key the user signed in with (sent as X-API-Key,
// exactly as the SDK does). The key stays in this tab's sessionStorage; nothing else is stored.
// `connection` says whether the server answered the last call: `downSince` is when calls began to fail to reach
// it (null while it answers), `refused` the server's words when it stopped taking the key; the page listens
// for "tx-connection" events to show a banner and mark what it shows as stale.

const KEY = "tx.console.key";

export class ApiError extends Error {
  constructor(status, detail) { super(status ? `${status}: ${detail}` : detail); this.status = status; this.detail = detail; }
}

export const connection = { downSince: null, refused: null };

function set(downSince, refused) {
  if (connection.downSince === downSince && connection.refused === refused) return;
  Object.assign(connection, { downSince, refused });
  window.dispatchEvent(new CustomEvent("tx-connection"));
}

export function apiKey() { return sessionStorage.getItem(KEY); }
export function setKey(key) { if (key) sessionStorage.setItem(KEY, key); else sessionStorage.removeItem(KEY); }

// A 422's [{loc, msg}] as lines "field: message" (the playground's fields), anything else as the server said it.
export function readable(detail) {
  if (Array.isArray(detail) && detail.every((d) => d && typeof d.msg === "string")) {
    return detail.map((d) => `${(d.loc || []).filter((p) => p !== "body" && p !== "query").join(".") || "request"}: ${d.msg}`).join("\n");
  }
  return typeof detail === "string" ? detail : JSON.stringify(detail);
}

// The answer early.js already asked for, for the page's first GET of `path` with `key` (once; else null).
function early(path, key) {
  const asked = window.txEarly;
  if (!asked || asked.key !== key || !(path in asked.responses)) return null;
  const response = asked.responses[path];
  delete asked.responses[path];
  return response;
}

// What early.js asked for and the first page did not take: never handed to a later page (it would be stale).
export function dropEarly() { window.txEarly = null; }

export async function api(path, { method = "GET", body } = {}) {
  const headers = { "X-API-Key": apiKey() || "" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await ((method === "GET" && early(path, headers["X-API-Key"])) ||
      fetch(`/api/v1${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) }));
  } catch (error) {
    set(connection.downSince || new Date(), connection.refused);
    throw new ApiError(0, `the server cannot be reached (${error.message || error})`);
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!response.ok) {
    const detail = readable(data && data.detail !== undefined ? data.detail : text);
    set(null, response.status === 401 ? detail : connection.refused);
    throw new ApiError(response.status, detail);
  }
  set(null, null);
  return data;
}

export const enc = encodeURIComponent;
export function checkpointPath(c) { return `/training_runs/${enc(c.run_id)}/checkpoints/${c.checkpoint_id.split("/").map(enc).join("/")}`; }
