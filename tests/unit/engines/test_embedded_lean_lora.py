"""The embedded engine's lean LoRA forward (tx/inference/engines/embedded/lean_lora.py) gives bitwise what PEFT's
own forward gives: one adapter (float32 and a bfloat16 base under float32 adapters), adapters disabled (the
base), and rows of two adapters mixed in one batch (PEFT's forward, taken through the fallback)."""

from __future__ import annotations

import copy

import pytest
import torch
from engine_weights import random_adapter

from tx.inference.engines.embedded.mixing import AdapterMixer

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_lean_forward_is_peft_s_forward_bitwise(reference_model, dtype):
    from peft import LoraConfig

    base = copy.deepcopy(reference_model).to(dtype)
    model, _ = random_adapter(base, 3, r=8, lora_alpha=32, targets=TARGETS)
    model.add_adapter("second", LoraConfig(r=8, lora_alpha=32, target_modules=TARGETS, lora_dropout=0.0))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B.second" in name:
                param.normal_(0, 0.3, generator=torch.Generator().manual_seed(5))
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    ids = torch.randint(0, 2048, (3, 12), generator=torch.Generator().manual_seed(1))
    model.set_adapter("default")
    peft_one = _logits(model, ids)
    with model.disable_adapter():
        peft_base = _logits(model, ids)
    mixed_names = ["default", "second", "__base__"]
    peft_mixed = _logits_mixed(model, ids, mixed_names)

    mixer = AdapterMixer()
    mixer.install(model)  # hooks the LoRA layers and gives every LoRA Linear the lean forward
    assert all("forward" in vars(m) for m in model.modules() if type(m).__name__ == "Linear" and hasattr(m, "lora_A"))
    assert torch.equal(_logits(model, ids), peft_one)
    with model.disable_adapter():
        assert torch.equal(_logits(model, ids), peft_base)
    mixer.set(mixed_names)
    assert torch.equal(_logits(model, ids), peft_mixed)
    mixer.set(None)
    model.set_adapter("second")
    assert not torch.equal(_logits(model, ids), peft_one), "the active adapter is the one applied"


def _logits_mixed(model, ids: torch.Tensor, names: list[str]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids, adapter_names=names).logits
