"""LoRA adapters: many named PEFT adapters on ONE shared, frozen base model.

Each run owns one adapter. Only the active adapter takes part in a forward pass and only its
parameters require gradients, so a pass, a step or a load on one run never touches another's
weights, gradients or optimizer. Internal adapter names are `run_<32 hex digits>`: all the same
length, so none is a substring of another (PEFT selects an adapter's keys by substring).
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import cast

import peft
import torch
from peft import get_peft_model, get_peft_model_state_dict
from transformers import PreTrainedModel

from tx.types import LoraConfig

LORA_ALPHA = 32
ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)


def peft_config_for(lora: LoraConfig) -> peft.LoraConfig:
    """The PEFT config of a run: rank, alpha 32, no dropout, the chosen module groups."""
    targets = [
        *(ATTN_MODULES if lora.train_attn else ()),
        *(MLP_MODULES if lora.train_mlp else ()),
        *(UNEMBED_MODULES if lora.train_unembed else ()),
    ]
    return peft.LoraConfig(
        r=lora.rank,
        lora_alpha=LORA_ALPHA,
        lora_dropout=0.0,
        bias="none",
        target_modules=targets,
        task_type="CAUSAL_LM",
    )


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Run the block on a private RNG seeded with `seed` (a random one when None)."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(secrets.randbits(63) if seed is None else seed)
        yield


class AdapterHost:
    """One base model and the LoRA adapters of every run on it."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self._peft: peft.PeftModel | None = None
        self._active: str | None = None

    @property
    def peft_model(self) -> peft.PeftModel:
        if self._peft is None:
            raise RuntimeError("no adapter was ever added to this base model")
        return self._peft

    def add(self, name: str, lora: LoraConfig) -> dict[str, torch.nn.Parameter]:
        """Add adapter `name`, initialised from `lora.seed`; its parameters by PEFT file name."""
        config = peft_config_for(lora)
        with _seeded(lora.seed, self.model.device):
            if self._peft is None:
                self._peft = get_peft_model(self.model, config, adapter_name=name)
            else:
                self._peft.add_adapter(name, config)
        self._active = None  # PEFT may have changed the active adapter
        return self.parameters(name)

    def remove(self, name: str) -> None:
        with warnings.catch_warnings():  # "adapter was active, now using another": expected here
            warnings.simplefilter("ignore")
            self.peft_model.delete_adapter(name)
        self._active = None

    def activate(self, name: str) -> None:
        """Make `name` the adapter of the next passes (and the only one that requires grads)."""
        if self._active != name:
            tuner = cast(peft.LoraModel, self.peft_model.base_model)  # a LoRA-only PeftModel's tuner
            tuner.set_adapter(name)
            self._active = name

    def parameters(self, name: str) -> dict[str, torch.nn.Parameter]:
        """Adapter `name`'s parameters, keyed as in its PEFT adapter file, in a stable order."""
        infix = f".{name}."
        return {
            key.replace(infix, ".", 1): param
            for key, param in sorted(self.peft_model.named_parameters())
            if infix in key
        }

    def peft_state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """Adapter `name`'s LoRA tensors as PEFT writes them; never the frozen base `lm_head`
        (PEFT would add it when `lm_head` is a target, as it counts it as an embedding layer)."""
        return get_peft_model_state_dict(self.peft_model, adapter_name=name, save_embedding_layers=False)

    def peft_config(self, name: str) -> peft.LoraConfig:
        config = self.peft_model.peft_config[name]
        assert isinstance(config, peft.LoraConfig), "every adapter here is a LoRA"
        return config

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        *,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        vision: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """(R, L, H) final hidden states (after the last norm) with the active adapter applied; no logits.

        The model's own forward runs, with its unembedding swapped for an identity for the call, so hooks on
        the root module (FSDP2's all-gathers in trainer workers) run as for a normal pass. `vision` holds a
        vision-language model's image inputs (pixel_values, image_grid_thw, mm_token_type_ids)."""
        unembedding = self.model.get_output_embeddings()
        self.model.set_output_embeddings(torch.nn.Identity())
        try:
            out = self.model(
                input_ids=input_ids,
                position_ids=position_ids,
                attention_mask=attention_mask,
                use_cache=False,
                **(vision or {}),
            )
        finally:
            self.model.set_output_embeddings(unembedding)
        return out.logits

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.get_text_config().vocab_size)

    @property
    def unembedding(self) -> torch.nn.Module:
        """The output projection (`lm_head`), wrapped by PEFT when a run trains it (`train_unembed`)."""
        unembedding = self.model.get_output_embeddings()
        if unembedding is None:
            raise RuntimeError(f"{type(self.model).__name__} has no output embeddings (lm_head)")
        return unembedding
