// The run page's first requests, asked while the page's modules load instead of after (issue 41: ~100 ms sooner
// on a reload): a classic script ahead of the rest, run as soon as the head is read. For #/runs/<id> with a key
// signed in, the run's whole metrics read and its checkpoints; api.js hands each answer to the page's first call
// for that same path with that same key, and app.js drops whatever its first page did not take.
(() => {
  const key = sessionStorage.getItem("tx.console.key"), match = location.hash.match(/^#\/runs\/(.+)$/);
  if (!key || !match) return;
  let id;
  try { id = encodeURIComponent(decodeURIComponent(match[1])); } catch { return; }  // the router would not match it either
  const responses = {};
  for (const path of [`/console/runs/${id}/metrics?after_seq=0`, `/console/checkpoints?run_id=${id}&limit=200`]) {
    responses[path] = fetch(`/api/v1${path}`, { headers: { "X-API-Key": key } });
    responses[path].catch(() => {});  // a failure is the taker's to report (as its own fetch's would be)
  }
  window.txEarly = { key, responses };
})();
