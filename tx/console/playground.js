// Playground: sample from a base model or sampler weights the key may read, with a chat (the model's chat
// template), raw text or raw token ids, and see each sampled token coloured by its logprob.

import { api } from "./api.js";
import { h, clear, fmtNum } from "./dom.js";

export const FLOOR = -8;  // logprobs at or below this are all red

export function colorOf(logprob) {
  // linear in logprob: 0 (probability 1) green, FLOOR/2 yellow, FLOOR and below red (hue 120 -> 0)
  const t = Math.max(0, Math.min(1, 1 - logprob / FLOOR));
  return `hsl(${Math.round(120 * t)}, 75%, 82%)`;
}

export async function render(main, ctx) {
  const models = await api("/console/playground/models");
  const model = h("select", { id: "model" },
    h("optgroup", { label: "base models" }, models.base_models.map((m) => h("option", { value: m }, m))),
    models.sampler_checkpoints.length ? h("optgroup", { label: "your sampler weights" },
      models.sampler_checkpoints.map((c) => h("option", { value: c.tinker_path }, c.tinker_path))) : "");
  const path = h("input", { id: "model-path", placeholder: "or any readable tinker://…/sampler_weights/… path", style: "width:100%" });
  const mode = h("select", { id: "mode" }, h("option", { value: "chat" }, "chat (the model's template)"), h("option", { value: "text" }, "raw text"), h("option", { value: "tokens" }, "raw token ids"));
  const messages = h("div", { id: "messages" });
  const addMessage = (role = "user", content = "") => {
    const row = h("div", { class: "msg" }, h("select", {}, ["system", "user", "assistant"].map((r) => h("option", { value: r, selected: r === role }, r))),
      h("textarea", {}, content), h("button", { title: "remove", onclick: () => row.remove() }, "×"));
    messages.append(row);
  };
  addMessage("user", "Hello! Tell me a story.");
  const text = h("textarea", { id: "prompt-text" }, "The quick brown fox");
  const tokens = h("textarea", { id: "prompt-tokens", placeholder: "ids separated by spaces or commas" }, "1 2 3 4 5");
  const chatBox = h("div", {}, messages, h("button", { onclick: () => addMessage() }, "+ message"));
  const prompts = { chat: chatBox, text, tokens };
  const promptBox = h("div");
  const showPrompt = () => clear(promptBox).append(prompts[mode.value]);
  mode.addEventListener("change", showPrompt);
  showPrompt();
  const num = (id, value, attrs = {}) => h("input", { id, type: "number", value, ...attrs });
  const params = { max_tokens: num("max-tokens", 24, { min: 1, max: 1024 }), temperature: num("temperature", 1, { step: 0.1, min: 0 }),
    top_p: num("top-p", 1, { step: 0.05, min: 0.01, max: 1 }), top_k: num("top-k", -1), seed: num("seed", ""), n: num("n", 2, { min: 1, max: 8 }) };
  const stop = h("input", { id: "stop", placeholder: "stop strings, comma-separated" });
  const out = h("div", { id: "samples" });
  const error = h("p", { class: "error", id: "playground-error" });
  const go = h("button", { class: "primary", id: "sample" }, "Sample");
  go.addEventListener("click", async () => {
    error.textContent = ""; go.disabled = true; clear(out).append(h("p", { class: "muted" }, "sampling…"));
    try {
      const body = { model: path.value.trim() || model.value, max_tokens: Number(params.max_tokens.value), temperature: Number(params.temperature.value),
        top_p: Number(params.top_p.value), top_k: Number(params.top_k.value), n: Number(params.n.value),
        stop: stop.value ? stop.value.split(",").map((s) => s.trim()).filter(Boolean) : [] };
      if (params.seed.value !== "") body.seed = Number(params.seed.value);
      if (mode.value === "chat") body.messages = [...messages.children].map((m) => ({ role: m.children[0].value, content: m.children[1].value }));
      else if (mode.value === "text") body.text = text.value;
      else body.tokens = tokens.value.split(/[\s,]+/).filter(Boolean).map(Number);
      show(out, await api("/console/playground/sample", { method: "POST", body }));
    } catch (e) { clear(out); error.textContent = String(e.message || e); }
    go.disabled = false;
  });
  // The playground sends text only; an audio (or image) prompt is encoded by the client, as the SDK and the
  // cookbook's renderers do (docs/cookbook.md#audio-recipes): say so rather than take a file it cannot send.
  const media = h("p", { class: "muted", id: "playground-media" }, "Text only: audio and image prompts need the SDK. ",
    "An audio model (Inkling) takes audio as DMel chunks the client encodes from a WAV, as the tinker-cookbook's ",
    "Inkling renderer does; the playground sends a chat, raw text or token ids.");
  const label = (text, field) => h("label", {}, text, field);
  main.append(h("h1", {}, "Playground"), h("div", { class: "playground" },
    h("div", { class: "panel" }, label("model", model), path, label("prompt as", mode), media, promptBox,
      h("div", { class: "params" }, Object.entries(params).map(([k, f]) => label(k.replace("_", " "), f))), label("stop", stop),
      h("p", {}, go), error),
    h("div", {}, h("div", { class: "panel muted" }, "token colour: probability of the sampled token ",
      h("span", { class: "scale" }, [-8, -6.4, -4.8, -3.2, -1.6, 0].map((lp) => h("span", { style: `background:${colorOf(lp)}`, title: `logprob ${lp}` }))),
      " logprob ≤ −8 → 0; hover a token for its id, logprob and probability"), out)));
  ctx.ready();
}

function show(out, data) {
  clear(out);
  data.samples.forEach((s, i) => {
    const mean = s.tokens.length ? s.tokens.reduce((a, t) => a + t.logprob, 0) / s.tokens.length : NaN;
    out.append(h("div", { class: "panel sample" }, h("div", { class: "muted" }, `sample ${i + 1} · ${s.tokens.length} tokens · ${s.finish_reason} · mean logprob ${fmtNum(mean, 3)} · prompt ${data.prompt_tokens} tokens`),
      h("div", {}, s.tokens.map((t) => h("span", { class: "tok", style: `background:${colorOf(t.logprob)}`, dataset: { logprob: String(t.logprob) },
        title: `id ${t.id} · logprob ${fmtNum(t.logprob, 4)} · p ${fmtNum(Math.exp(t.logprob), 3)}` }, t.text === "" ? `⟨${t.id}⟩` : t.text)))));
  });
}
