"""LoRA adapters: many named PEFT adapters on ONE shared, frozen base model.

Each run owns one adapter. Only the active adapter takes part in a forward pass and only its
parameters require gradients, so a pass, a step or a load on one run never touches another's
weights, gradients or optimizer. Internal adapter names are `run_<32 hex digits>`: all the same
length, so none is a substring of another (PEFT selects an adapter's keys by substring).
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from typing import cast

import peft
import torch
from peft import get_peft_model, get_peft_model_state_dict
from transformers import PreTrainedModel

from tx.backends.torch.model import checkpointing_off
from tx.backends.torch.lora_probe import probe_structure
from tx.backends.torch.packing import PackingMode, boundary_masks
from tx.models.lora_targets import ModelStructure, exact_targets, peft_config, read_structure
from tx.multimodal.placeholders import text_placeholders_apart
from tx.types import LoraConfig

LORA_ALPHA = 32


def peft_config_for(lora: LoraConfig, structure: ModelStructure, held: Collection[str] | None = None
                    ) -> peft.LoraConfig:
    """The PEFT config of a run on a model of `structure`: rank, alpha 32, no dropout, the modules (and fused
    experts) of the chosen groups (`tx/models/lora_targets.py`). With `held` (the adapter's tensor names), the
    modules those tensors hold: a structure read from the model's files (`structure_of`) is not probed, and
    the config must name what the trainer's adapter has."""
    if held is not None:
        return peft_config(structure.targets_holding(held, mlp=lora.train_mlp), lora.rank, LORA_ALPHA)
    targets = structure.targets(attn=lora.train_attn, mlp=lora.train_mlp, unembed=lora.train_unembed)
    return peft_config(targets, lora.rank, LORA_ALPHA)


@contextmanager
def _seeded(seed: int | None, device: torch.device) -> Iterator[None]:
    """Run the block on a private RNG seeded with `seed` (a random one when None)."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(secrets.randbits(63) if seed is None else seed)
        yield


class AdapterHost:
    """One base model and the LoRA adapters of every run on it."""

    def __init__(self, model: PreTrainedModel, packing: PackingMode = "padded", logit_cap: float | None = None
                 ) -> None:
        """`packing`: how micro-batches lay datums into rows for this model (`packing.choose_packing`);
        `logit_cap`: the softcap of its logits, None for none (`logit_cap.choose_logit_cap`)."""
        self.model = model
        self.packing: PackingMode = packing
        self.logit_cap = logit_cap
        self._peft: peft.PeftModel | None = None
        self._active: str | None = None
        self._structure: ModelStructure | None = None  # read before the first adapter wraps any module
        self.checkpoint_above: int | None = None
        """With gradient checkpointing on: the largest pass (rows x width tokens) that keeps every layer's
        activations instead (None: every pass checkpoints)."""

    @property
    def structure(self) -> ModelStructure:
        """Where LoRA can go on the base model, as read and then probed (`lora_probe.py`); UserError (at
        create_model) when it cannot be read."""
        if self._structure is None:
            if self._peft is not None:
                raise RuntimeError("the structure is read before any adapter is added")
            name = self.model.name_or_path or type(self.model).__name__
            self._structure = probe_structure(self.model, read_structure(self.model), name)
        return self._structure

    @property
    def peft_model(self) -> peft.PeftModel:
        if self._peft is None:
            raise RuntimeError("no adapter was ever added to this base model")
        return self._peft

    @contextmanager
    def base_only(self) -> Iterator[None]:
        """The base model's own forward, every adapter off, while the body runs (on the training thread)."""
        if self._peft is None:
            yield
            return
        with self._peft.disable_adapter():
            yield

    def add(self, name: str, lora: LoraConfig) -> dict[str, torch.nn.Parameter]:
        """Add adapter `name`, initialised from `lora.seed`; its parameters by PEFT file name."""
        config = peft_config_for(lora, self.structure)
        with _seeded(lora.seed, self.model.device), exact_targets():
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

    def activate_many(self, names: list[str]) -> None:
        """Make `names` the adapters of the next pass together, each requiring grads (a fused pass, where
        `segments.py` gives each its own rows)."""
        tuner = cast(peft.LoraModel, self.peft_model.base_model)
        tuner.set_adapter(names)
        self._active = None

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
        """(R, L, H) final hidden states (the unembedding's input) with the active adapter applied; no logits.

        The model's own forward runs, with its unembedding swapped for an identity that keeps its input for the
        call (what the model does to its head's output, a softcap, then runs on the hidden states and is
        dropped), so hooks on the root module (FSDP2's all-gathers in trainer workers) run as for a normal pass. `vision` holds a
        vision-language model's image inputs (pixel_values, image_grid_thw, mm_token_type_ids); placeholder
        ids outside its images are text (`tx.multimodal.placeholders`). Packed rows of a "packed_masks" model
        get the masks of their datum boundaries (`packing.boundary_masks`)."""
        masks: torch.Tensor | dict[str, torch.Tensor | None] | None = attention_mask
        if self.packing == "packed_masks" and position_ids is not None:
            masks = boundary_masks(self.model, input_ids, position_ids)
        unembedding = self.model.get_output_embeddings()
        keep = _KeepInput()
        self.model.set_output_embeddings(keep)
        small = self.checkpoint_above is not None and input_ids.numel() <= self.checkpoint_above
        try:
            with (checkpointing_off(self.model) if small else nullcontext(),
                  text_placeholders_apart(self.model, input_ids, vision or {}) as model_ids):
                self.model(
                    input_ids=model_ids,
                    position_ids=position_ids,
                    attention_mask=masks,
                    use_cache=False,
                    **(vision or {}),
                )
        finally:
            self.model.set_output_embeddings(unembedding)
        if keep.input is None:
            raise RuntimeError(f"{type(self.model).__name__}'s forward never called its unembedding")
        return keep.input

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


class _KeepInput(torch.nn.Module):
    """An identity standing in for the unembedding during `AdapterHost.hidden_states`: it keeps its input."""

    def __init__(self) -> None:
        super().__init__()
        self.input: torch.Tensor | None = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        self.input = hidden
        return hidden
