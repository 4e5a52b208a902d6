"""OpenAI-compatible inference (/oai/api/v1) with the official `openai` client, on a trained sampler path:
the answers are the same engines' samples the tinker SDK gets (greedy, so they must match exactly).
Last, /metrics counts this module's work (it shares the session's server)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
import tinker
from prometheus_client.parser import text_string_to_metric_families
from sdk_datums import sft_datum
from tinker import types
from txserver import API_KEY, TxServer

BASE = "tiny-qwen3"
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def trained(server: TxServer) -> Iterator[tuple[str, tinker.SamplingClient, object]]:
    """A sampler checkpoint after a few SFT steps, its SDK sampling client and the model's tokenizer."""
    with server.client() as service:
        tc = service.create_lora_training_client(BASE, rank=8, seed=0).result()
        tokenizer = tc.get_tokenizer()
        tokens = tokenizer.encode(PROMPT + " Paris, and the capital of Italy is Rome.")
        datum = sft_datum(tokens)
        for _ in range(5):
            tc.forward_backward([datum], "cross_entropy").result()
            tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        path = tc.save_weights_for_sampler("oai").result().path
        yield path, service.create_sampling_client(model_path=path).result(), tokenizer


@pytest.fixture(scope="module")
def client(server: TxServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{server.url}/oai/api/v1", api_key=API_KEY, max_retries=0) as c:
        yield c


def greedy(sampler: tinker.SamplingClient, tokens: list[int], max_tokens: int) -> list[int]:
    params = types.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return list(sampler.sample(types.ModelInput.from_ints(tokens), 1, params).result().sequences[0].tokens)


def test_models_lists_the_base_model(client: openai.OpenAI) -> None:
    assert BASE in [m.id for m in client.models.list()]


def test_completions_on_a_sampler_path(client: openai.OpenAI, trained) -> None:
    path, sampler, tokenizer = trained
    out = client.completions.create(model=path, prompt=PROMPT, max_tokens=8, temperature=0.0, logprobs=0)
    want = greedy(sampler, tokenizer.encode(PROMPT), 8)
    (choice,) = out.choices
    assert choice.text == tokenizer.decode(want, skip_special_tokens=True)
    assert out.usage.prompt_tokens == len(tokenizer.encode(PROMPT)) and out.usage.completion_tokens == len(want)
    assert choice.finish_reason in ("stop", "length") and len(choice.logprobs.token_logprobs) == len(want)
    base = client.completions.create(model=BASE, prompt=PROMPT, max_tokens=8, temperature=0.0)
    assert base.choices[0].text != choice.text  # the trained weights answered, not the base model

    stream = client.completions.create(model=path, prompt=PROMPT, max_tokens=8, temperature=0.0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks) == choice.text
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason


def test_chat_uses_the_models_chat_template(client: openai.OpenAI, trained) -> None:
    path, sampler, tokenizer = trained
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    out = client.chat.completions.create(model=path, messages=messages, max_tokens=6, temperature=0.0)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    want = greedy(sampler, tokenizer.encode(rendered, add_special_tokens=False), 6)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == tokenizer.decode(want, skip_special_tokens=True)

    stream = client.chat.completions.create(model=path, messages=messages, max_tokens=6, temperature=0.0,
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == out.choices[0].message.content


def test_logprobs_and_top_logprobs_are_the_samplers(client: openai.OpenAI, trained) -> None:
    path, sampler, tokenizer = trained
    tokens = tokenizer.encode(PROMPT)
    answer = sampler.sample(types.ModelInput.from_ints(tokens), 1, types.SamplingParams(max_tokens=6, temperature=0.0),
                            topk_sample_logprobs=3).result().sequences[0]
    top = answer.topk_logprobs_np
    out = client.completions.create(model=path, prompt=tokens, max_tokens=6, temperature=0.0, logprobs=3)
    logprobs = out.choices[0].logprobs
    kept = len(logprobs.token_logprobs)
    assert logprobs.token_logprobs == pytest.approx(answer.logprobs[:kept], abs=1e-6)
    for row, ids, values in zip(logprobs.top_logprobs, top.token_ids, top.logprobs):
        assert row == pytest.approx({tokenizer.decode([int(t)]): float(v) for t, v in zip(ids, values)}, abs=1e-6)
    chat = client.chat.completions.create(model=path, messages=[{"role": "user", "content": PROMPT}], max_tokens=4,
                                          temperature=0.0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert content and all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.logprob - 1e-6
                           for c in content)
    with pytest.raises(openai.BadRequestError, match="top_logprobs needs logprobs"):
        client.chat.completions.create(model=path, messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                       top_logprobs=2)


def test_stop_strings_n_and_seed(client: openai.OpenAI, trained) -> None:
    path, _, _ = trained
    out = client.completions.create(model=path, prompt=PROMPT, max_tokens=12, n=3, seed=7, temperature=1.0)
    again = client.completions.create(model=path, prompt=PROMPT, max_tokens=12, n=3, seed=7, temperature=1.0)
    assert len(out.choices) == 3 and [c.text for c in out.choices] == [c.text for c in again.choices]
    first = out.choices[0].text
    if len(first) > 2:
        stop = first[1:3]
        cut = client.completions.create(model=path, prompt=PROMPT, max_tokens=12, n=3, seed=7, stop=[stop])
        assert cut.choices[0].text == first[: first.find(stop)]


def _generated_tokens(server: TxServer) -> int:
    (group,) = [g for g in server.engine_groups() if g["base_model"] == BASE]
    return sum(engine["health"]["stats"]["num_generated_tokens"] for engine in group["engines"])


def test_streaming_sends_the_first_tokens_before_the_last_is_generated(client: openai.OpenAI,
                                                                        server: TxServer) -> None:
    body = dict(model=BASE, prompt=PROMPT, max_tokens=400, temperature=0.0, stop=["\n\n\n\n"])
    whole = client.completions.create(**body).choices[0]
    assert whole.finish_reason == "length", "the test needs a long answer: pick a prompt that runs to max_tokens"
    before = _generated_tokens(server)
    pieces, generated_at_first = [], None
    for chunk in client.completions.create(**body, stream=True):
        if chunk.choices[0].text and generated_at_first is None:
            generated_at_first = _generated_tokens(server) - before
        pieces.append(chunk.choices[0].text)
    assert generated_at_first is not None and generated_at_first < 400, (
        f"the first text arrived after {generated_at_first} of 400 tokens were generated")
    assert "".join(pieces) == whole.text, "the streamed text is the whole answer's, stop string held back"
    assert _generated_tokens(server) - before == 400

    messages = [{"role": "user", "content": PROMPT}]
    chunks = list(client.chat.completions.create(model=BASE, messages=messages, max_tokens=40, temperature=0.0,
                                                 n=2, stream=True))
    whole_chat = client.chat.completions.create(model=BASE, messages=messages, max_tokens=40, temperature=0.0, n=2)
    for i in range(2):
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices[0].index == i)
        assert text == whole_chat.choices[i].message.content
    with pytest.raises(openai.BadRequestError, match="exceeds"):  # refused before the stream starts: a 400
        client.completions.create(model=BASE, prompt=PROMPT, max_tokens=4000, stream=True)


def test_bad_requests_are_4xx(client: openai.OpenAI, server: TxServer) -> None:
    with pytest.raises(openai.BadRequestError, match="not served"):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises((openai.BadRequestError, openai.NotFoundError)):
        client.completions.create(model="tinker://nope:train:0/sampler_weights/x", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="not supported"):
        client.completions.create(model=BASE, prompt="x", max_tokens=2, echo=True)
    with pytest.raises(openai.UnprocessableEntityError):
        client.completions.create(model=BASE, prompt="x", max_tokens=0)
    bad_key = openai.OpenAI(base_url=f"{server.url}/oai/api/v1", api_key="not-a-tinker-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()
    bad_key.close()


def test_dense_bodies_are_counted_before_their_items_are_validated(server: TxServer) -> None:
    """4 MB of one-character messages (to /oai and the playground): a 422 naming the count, without validating
    130,000 messages on the server's event loop (0.3 s) nor echoing the body back."""
    dense = {"model": BASE, "messages": [{"role": "user", "content": "a"}] * 130_000}
    parts = {"model": BASE, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 65}]}
    with httpx.Client(base_url=f"{server.url}/oai/api/v1", headers={"Authorization": f"Bearer {API_KEY}"}) as http:
        for body, said in ((dense, "messages holds 130000 items; at most 4096"),
                           (parts, "messages[0].content holds 65 parts; at most 64"),
                           ({"model": BASE, "prompt": "x", "stop": ["a"] * 5}, "stop holds 5 items; at most 4")):
            route = "/completions" if "prompt" in body else "/chat/completions"
            reply = http.post(route, json=body)
            assert reply.status_code == 422 and said in reply.text and len(reply.content) < 2000, reply.text[:300]
    reply = httpx.post(f"{server.url}/api/v1/console/playground/sample", headers={"X-API-Key": API_KEY}, json=dense)
    assert reply.status_code == 422 and "messages holds 130000 items; at most 64" in reply.text, reply.text[:300]


def test_metrics_count_the_training_and_sampling(server: TxServer, client: openai.OpenAI, trained) -> None:
    """After this module's SFT steps and samples: tokens trained and sampled, weights pushed, an engine up."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    values = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for family in text_string_to_metric_families(text) for s in family.samples}
    assert values[("tx_trained_tokens_total", ())] >= 5 * 10
    assert values[("tx_sampled_tokens_total", ())] > 0
    assert values[("tx_weight_push_bytes_total", ())] > 0 and values[("tx_weight_push_seconds_total", ())] > 0
    assert values[("tx_engines_alive", (("base_model", BASE),))] >= 1
    assert values[("tx_engine_group_state", (("base_model", BASE), ("state", "awake")))] == 1
    route = (("method", "POST"), ("route", "/oai/api/v1/completions"), ("status", "200"))
    assert values[("tx_http_requests_total", route)] >= 2
    assert ("tx_futures_pending", ()) in values and ("tx_engine_restarts_total", ()) in values
