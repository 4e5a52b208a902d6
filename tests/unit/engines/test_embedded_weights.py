"""Weights pushed into a live engine over a gloo group: LoRA adapters (PEFT) and full base weights."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import engine_reference as reference
from engine_weights import assert_update_reaches_a_running_request, gloo_sender, perturbed, push, random_adapter
from tx.inference.protocol import ROUTE_WEIGHTS_UPDATE_IPC, IpcWeightsUpdateRequest
from tx.inference.weight_sync import plan_update
from tx.inference.weight_sync.types import IpcUpdate

PROMPT = [5, 17, 230, 1000, 44]
TARGETS = ["q_proj", "v_proj", "down_proj"]


@pytest.fixture(scope="module")
def sender(engine):
    yield from gloo_sender(engine)


def make_adapter(reference_model, seed: int):
    """A random non-zero LoRA adapter: its PEFT model, its tensors and its engine spec."""
    model, named = random_adapter(reference_model, seed, r=4, lora_alpha=8, targets=TARGETS)
    return model, named, {"r": 4, "lora_alpha": 8, "target_modules": TARGETS}


def test_lora_adapters_match_peft(engine, sender, reference_model):
    base = engine.generate(prompt_token_ids=PROMPT, max_tokens=16, temperature=0.0, stop_at_eos=False)
    adapters = {}
    for name, seed in (("a1", 1), ("a2", 2)):
        model, named, lora = make_adapter(reference_model, seed)
        result = push(engine, sender, named, adapter=name, lora=lora)
        assert result["num_tensors"] == len(named)
        adapters[name] = model
    engine.post("/weights/finish", {"version": "v1", "adapter": "a1"})
    assert engine.health()["adapters"] == {"a1": "v1", "a2": None}

    common = dict(prompt_token_ids=PROMPT, max_tokens=16, seed=5, stop_at_eos=False)
    bodies = [dict(common, adapter=name, temperature=t) for name in ("a1", "a2", None) for t in (0.0, 0.8)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        outs = list(pool.map(lambda body: engine.generate(**body), bodies))
    for body, out in zip(bodies, outs):
        seq = out["sequences"][0]
        model = adapters.get(body["adapter"], reference_model)
        reference.assert_raw_logprobs(model, PROMPT, seq)
    assert outs[0]["sequences"][0]["token_ids"] != base["sequences"][0]["token_ids"]
    assert outs[4]["sequences"][0]["token_ids"] == base["sequences"][0]["token_ids"], "base is unaffected"

    engine.post("/weights/finish", {"version": "v2", "adapter": "a2", "remove_adapters": ["a1"]})
    assert engine.health()["adapters"] == {"a2": "v2"}
    assert engine.http.delete("/adapters/a2").json()["adapters"] == {}
    response = engine.http.post("/generate", json={"prompt_token_ids": PROMPT, "adapter": "a2"})
    assert response.status_code == 404


def test_an_adapter_updated_in_place_reaches_a_running_request(engine, sender, reference_model):
    assert_update_reaches_a_running_request(engine, sender, reference_model, {"r": 4, "lora_alpha": 8,
                                            "target_modules": TARGETS}, TARGETS, PROMPT)


def test_full_weights_push(engine, sender, reference_model):
    original = [(name, t.detach().clone()) for name, t in reference_model.state_dict().items()]
    changed_model = perturbed(reference_model, seed=7)
    changed = [(name, t.detach().contiguous()) for name, t in changed_model.state_dict().items()]
    push(engine, sender, changed)
    engine.post("/weights/finish", {"version": "step-3"})
    assert engine.health()["base_version"] == "step-3"
    seq = engine.generate(prompt_token_ids=PROMPT, max_tokens=12, temperature=1.0, seed=1)["sequences"][0]
    reference.assert_raw_logprobs(changed_model, PROMPT, seq)
    push(engine, sender, original)
    seq = engine.generate(prompt_token_ids=PROMPT, max_tokens=12, temperature=1.0, seed=1)["sequences"][0]
    reference.assert_raw_logprobs(reference_model, PROMPT, seq)


def test_unknown_base_tensor_is_rejected_without_hanging(engine, sender):
    response = None
    named = [("model.not_a_layer.weight", torch.zeros(3, 3))]
    update = plan_update(named)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(engine.http.post, "/weights/update", json={"transfer": update.model_dump()})
        sender.send(named, update)
        response = pending.result(timeout=60)
    assert response.status_code == 400 and "not_a_layer" in response.text


def test_sleep_keeps_adapters_at_level_1_and_drops_them_at_level_2(engine, sender, reference_model):
    model, named, lora = make_adapter(reference_model, seed=3)
    push(engine, sender, named, adapter="kept", lora=lora)
    body = dict(adapter="kept", prompt_token_ids=PROMPT, max_tokens=8, temperature=0.0, stop_at_eos=False)
    before = engine.generate(**body)["sequences"][0]
    engine.post("/sleep", {"level": 1})
    engine.post("/wake_up")
    assert engine.generate(**body)["sequences"][0]["token_ids"] == before["token_ids"]
    engine.post("/sleep", {"level": 2})
    assert engine.post("/wake_up")["sleeping_level"] == 0
    assert engine.health()["adapters"] == {}
    seq = engine.generate(**{**body, "adapter": None})["sequences"][0]
    reference.assert_raw_logprobs(reference_model, PROMPT, seq)


def test_cuda_ipc_push_into_a_cpu_engine_is_a_clear_conflict(engine):
    body = IpcWeightsUpdateRequest(ipc=IpcUpdate(buckets=[])).model_dump(mode="json")
    answer = engine.post(ROUTE_WEIGHTS_UPDATE_IPC, body, expect=409)
    assert "CUDA IPC" in answer["detail"] and "cpu" in answer["detail"]
    assert engine.health()["weight_transports"] == ["gloo"]


def test_bf16_engine_keeps_pushed_lora_in_float32(tiny_model_dir, reference_model, tmp_path):
    """A bf16 engine (the trainer's dtype) holds its base in bf16 and a pushed adapter in float32, as the
    trainer does, through sleep and wake."""
    from tx.inference.engines.embedded.weights import Weights
    from tx.inference.protocol import LoraSpec

    weights = Weights(tiny_model_dir, max_adapters=2, stash_dir=tmp_path, device="cpu", dtype="bfloat16")
    _, named, lora = make_adapter(reference_model, seed=1)
    weights.load_adapter("a", LoraSpec(**lora), dict(named))

    def dtypes() -> tuple[set[torch.dtype], set[torch.dtype]]:
        params = dict(weights.model.named_parameters())
        return ({p.dtype for n, p in params.items() if "lora_" not in n},
                {p.dtype for n, p in params.items() if "lora_" in n})

    assert dtypes() == ({torch.bfloat16}, {torch.float32})
    weights.sleep(1)
    weights.wake(None)
    assert dtypes() == ({torch.bfloat16}, {torch.float32})
    lora_b = next(p for n, p in weights.model.named_parameters() if "lora_B" in n)
    assert lora_b.abs().sum() > 0, "the pushed values landed"
    weights.close()
