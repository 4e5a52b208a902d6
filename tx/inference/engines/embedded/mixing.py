"""Rows of different LoRA adapters in one forward: the base weights run once for the whole batch, and each LoRA
layer adds each adapter's low-rank update on its own rows only (PEFT's mixed-adapter batches).

Design / who owns what:
- PEFT's LoRA `Linear` and `Embedding` layers take `adapter_names=[one name per row]` in their forward ("__base__":
  no update on that row). `AdapterMixer` hands them that list through one forward pre-hook per LoRA layer, set
  once when the layer appears, instead of PEFT's own per-forward hook registration (`adapter_names=` on the
  model's forward walks every module twice per call: a cost on every decode step).
- Other LoRA layers (PEFT's `ParamWrapper`, for `target_parameters` such as fused MoE experts) refuse mixed
  batches; a model holding any is not `mixable`, and the scheduler then batches one adapter at a time.
- Rows of one adapter: every LoRA `Linear` runs `lean_lora.lean_forward` (PEFT's math, less Python).
- `Weights.use` (the owner of the model) sets `names` for one forward, under the weights lock.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from tx.inference.engines.embedded import lean_lora

BASE = "__base__"  # PEFT's name for "no adapter" in a mixed batch


class AdapterMixer:
    """Per-row adapter names for the next forward of a PEFT model (None: every row uses the active adapter)."""

    def __init__(self) -> None:
        self.names: list[str] | None = None
        self.mixable = True
        self.generation = 0  # counts `install` calls: the model's LoRA layers may have changed
        self._hooked: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()

    def install(self, model: torch.nn.Module) -> None:
        """Hook every LoRA layer of `model` not hooked yet (call after adapters are added); `mixable` says whether
        every one of them takes mixed batches."""
        from peft.tuners.lora import layer as lora

        mixable = True
        self.generation += 1
        for module in model.modules():
            if not isinstance(module, lora.LoraLayer):
                continue
            mixable = mixable and type(module) in (lora.Linear, lora.Embedding)
            if module not in self._hooked:
                module.register_forward_pre_hook(self._inject, with_kwargs=True)
                if type(module) is lora.Linear:
                    lean_lora.install(module)
                self._hooked.add(module)
        self.mixable = mixable

    def set(self, names: Sequence[str] | None) -> None:
        self.names = list(names) if names is not None else None

    def _inject(self, _module: torch.nn.Module, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if self.names is not None:
            kwargs["adapter_names"] = self.names
        return args, kwargs
