// The console talks to tx's own JSON routes with the API key the user signed in with (sent as X-API-Key,
// exactly as the SDK does). The key stays in this tab's sessionStorage; nothing else is stored.

const KEY = "tx.console.key";

export class ApiError extends Error {
  constructor(status, detail) { super(`${status}: ${detail}`); this.status = status; this.detail = detail; }
}

export function apiKey() { return sessionStorage.getItem(KEY); }
export function setKey(key) { if (key) sessionStorage.setItem(KEY, key); else sessionStorage.removeItem(KEY); }

export async function api(path, { method = "GET", body } = {}) {
  const headers = { "X-API-Key": apiKey() || "" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(`/api/v1${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!response.ok) {
    const detail = data && data.detail !== undefined ? data.detail : text;
    throw new ApiError(response.status, typeof detail === "string" ? detail : JSON.stringify(detail));
  }
  return data;
}

export const enc = encodeURIComponent;
export function checkpointPath(c) { return `/training_runs/${enc(c.run_id)}/checkpoints/${c.checkpoint_id.split("/").map(enc).join("/")}`; }
