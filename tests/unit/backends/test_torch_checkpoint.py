"""save_state / load_state / save_sampler_weights / iter_trainable_weights of the torch backend."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from backend_helpers import TINY_NAME, ce, grads, randomize, sft_data, snapshot, train
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tx.optimizers import AdamParams
from tx.types import LoraConfig, UserError

LORA = LoraConfig(rank=8, seed=0, train_mlp=False)
DATA = sft_data(seed=0, count=2, length=17)


def test_state_round_trip_reproduces_the_next_step(backend, tmp_path):
    backend.create_model("a", TINY_NAME, LORA)
    train(backend, "a", DATA, steps=3)
    backend.save_state("a", tmp_path / "state")
    next_losses = train(backend, "a", DATA, steps=2)

    assert backend.read_state_config(tmp_path / "state") == (TINY_NAME, LORA)
    backend.create_model("b", TINY_NAME, LoraConfig(rank=8, seed=7, train_mlp=False))
    backend.load_state("b", tmp_path / "state", with_optimizer=True)
    assert train(backend, "b", DATA, steps=2) == next_losses

    backend.create_model("c", TINY_NAME, LoraConfig(rank=8, seed=7, train_mlp=False))
    backend.load_state("c", tmp_path / "state", with_optimizer=False)
    without = train(backend, "c", DATA, steps=2)
    assert without[0] == next_losses[0]  # same weights
    assert without[1] != next_losses[1]  # fresh Adam moments


def test_load_state_drops_pending_grads_and_spares_other_runs(backend, tmp_path):
    backend.create_model("a", TINY_NAME, LORA)
    backend.create_model("b", TINY_NAME, LORA)
    randomize(backend, "a", seed=1)
    randomize(backend, "b", seed=2)
    backend.forward_backward("b", ce(DATA))
    b_weights, b_grads = snapshot(backend, "b"), grads(backend, "b")
    backend.save_state("a", tmp_path / "a")
    backend.save_state("b", tmp_path / "b")
    backend.forward_backward("a", ce(DATA))
    backend.load_state("a", tmp_path / "a", with_optimizer=True)
    assert all(g is None for g in grads(backend, "a").values())
    assert all(torch.equal(b_weights[n], w) for n, w in snapshot(backend, "b").items())
    assert all(torch.equal(b_grads[n], g) for n, g in grads(backend, "b").items())


def test_state_files_are_safe_to_read(backend, tmp_path):
    backend.create_model("a", TINY_NAME, LORA)
    train(backend, "a", DATA, steps=1)
    backend.save_state("a", tmp_path / "s")
    files = {p.name for p in (tmp_path / "s").iterdir()}
    assert files == {"adapter_model.safetensors", "tx_state.json", "optimizer.pt"}
    torch.load(tmp_path / "s" / "optimizer.pt", weights_only=True)
    meta = json.loads((tmp_path / "s" / "tx_state.json").read_text())
    assert meta["base_model"] == TINY_NAME and meta["lora"]["rank"] == 8


def test_load_state_refuses_a_mismatched_run(backend, tmp_path):
    backend.create_model("a", TINY_NAME, LORA)
    backend.save_state("a", tmp_path / "s")
    backend.create_model("b", TINY_NAME, LoraConfig(rank=4, seed=0, train_mlp=False))
    with pytest.raises(UserError, match="does not fit"):
        backend.load_state("b", tmp_path / "s", with_optimizer=True)
    with pytest.raises(UserError):
        backend.read_state_config(tmp_path / "missing")


def test_sampler_weights_load_with_peft_and_match_the_run(backend, tiny_model_dir, tmp_path):
    backend.create_model("other", TINY_NAME, LoraConfig(rank=4, seed=3))
    backend.create_model("a", TINY_NAME, LoraConfig(rank=8, seed=0))  # attn + mlp + lm_head
    train(backend, "a", DATA, steps=3)
    train(backend, "other", DATA, steps=1)
    backend.save_sampler_weights("a", tmp_path / "sampler")

    config = json.loads((tmp_path / "sampler" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == TINY_NAME
    assert (config["r"], config["lora_alpha"]) == (8, 32)
    saved = load_file(tmp_path / "sampler" / "adapter_model.safetensors")
    weights = dict(backend.iter_trainable_weights("a"))
    assert set(saved) == set(weights)
    assert all(torch.equal(saved[n], weights[n]) for n in saved)

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, tmp_path / "sampler").eval()
    tokens = [d.model_input.text_tokens() for d in DATA]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor(tokens)).logits, dim=-1)
    outputs = backend.forward_backward("a", ce(DATA, forward_only=True)).loss_fn_outputs
    for i, d in enumerate(DATA):
        want = logp[i].gather(-1, torch.from_numpy(d.loss_fn_inputs["target_tokens"])[:, None])[:, 0]
        np.testing.assert_allclose(outputs[i]["logprobs"], want.numpy(), rtol=1e-5, atol=1e-5)


def test_iter_trainable_weights_are_the_peft_names(backend):
    backend.create_model("a", TINY_NAME, LORA)
    names = [name for name, _ in backend.iter_trainable_weights("a")]
    assert names and all(n.startswith("base_model.model.") and ".lora_" in n for n in names)
    assert not any("run_" in n for n in names)
    host = backend._hosts[TINY_NAME]
    assert set(names) == set(host.peft_state_dict(backend._runs["a"].adapter))


def test_state_survives_optimizer_step_metrics(backend, tmp_path):
    backend.create_model("a", TINY_NAME, LORA)
    backend.forward_backward("a", ce(DATA))
    backend.save_state("a", tmp_path / "s")  # pending grads are not part of the state
    backend.optim_step("a", AdamParams(learning_rate=1e-2))
    backend.create_model("b", TINY_NAME, LORA)
    backend.load_state("b", tmp_path / "s", with_optimizer=True)
    assert all(g is None for g in grads(backend, "b").values())
