"""Several runs' adapters in one pass over the shared base: each run owns a contiguous block of the batch's rows,
and every LoRA layer applies to a block only its run's adapter (`segmented`).

- A LoRA `Linear` (attention, MLPs, linear attention, MLA projections) runs its base layer ONCE on all rows, then
  each run's low-rank update on its own rows, added to that block's base output as PEFT adds one adapter's; the
  blocks are joined again with one concatenation. In float32 with plain LoRA adapters, each block instead runs
  through the one-node layer a run alone takes (`lean_body.lean_output`), so its rows round as alone.
- Any other LoRA layer (PEFT's `ParamWrapper` on fused MoE experts, whose delta is folded into the weight) runs
  once per block with that block's adapter active: the same work as each run alone, the base weights shared.
- A layer's input is cut by its leading dimension: the rows, or the rows' tokens flattened (MoE experts see
  rows x width entries). Tensor arguments with the same leading dimension are cut alike (experts' routing),
  and those with a multiple of it in proportion (the rows' tokens flattened beside an input that keeps its
  rows: Inkling's shared experts get their routing weights so). A layer whose input fits neither raises
  `SegmentsUnsupported`; `fused.py` checks each base model once (`self_check`) and trains in turns where a
  family does not fit.

The unembedding is left out (`skip`): the trainer's head runs per run on flat positions (`head_of`). The blocks'
runs are active together (`AdapterHost.activate_all`), so each run's LoRA parameters get gradients from its own
rows only: rows never see each other, hence one backward of the runs' summed losses is each run's own backward.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
from peft.tuners.lora.layer import Linear as LoraLinear
from peft.tuners.lora.layer import LoraLayer

from tx.backends.torch.head import plain_adapter
from tx.backends.torch.lean_body import lean_output


class SegmentsUnsupported(RuntimeError):
    """A LoRA layer's input cannot be cut into the runs' blocks (this family trains runs in turns)."""


@dataclass(frozen=True)
class Block:
    """Rows [start, stop) of the batch go through `adapter`."""

    adapter: str
    start: int
    stop: int


@dataclass
class _Pass:
    blocks: Sequence[Block]
    rows: int
    inside: bool = False  # a block of an enclosing LoRA layer is running: nested LoRA layers pass through


def lora_layers(model: torch.nn.Module, skip: torch.nn.Module | None = None) -> list[torch.nn.Module]:
    """Every LoRA layer (a module that is a PEFT `LoraLayer`) of `model` outside `skip`, each once."""
    skipped = {id(m) for m in skip.modules()} if skip is not None else set()
    return [m for m in model.modules() if isinstance(m, LoraLayer) and id(m) not in skipped]


@contextmanager
def segmented(layers: Sequence[torch.nn.Module], blocks: Sequence[Block], rows: int) -> Iterator[None]:
    """While open (the forward AND the backward, which may recompute checkpointed layers), every layer in `layers`
    applies each block's adapter to its rows only."""
    state = _Pass(blocks, rows)
    for layer in layers:
        original = type(layer).forward
        setattr(layer, "forward", functools.partial(_forward, layer, original, state))  # the instance's wins
    try:
        yield
    finally:
        for layer in layers:
            delattr(layer, "forward")


@contextmanager
def only(layers: Sequence[torch.nn.Module], adapter: str) -> Iterator[None]:
    """`adapter` alone active on `layers` (LoRA layers: the head's, for one run's positions)."""
    saved = [_active(layer) for layer in layers]
    for layer in layers:
        _activate(layer, [adapter])
    try:
        yield
    finally:
        for layer, active in zip(layers, saved, strict=True):
            _activate(layer, active)


def _active(layer: torch.nn.Module) -> list[str]:
    assert isinstance(layer, LoraLayer)
    return list(layer.active_adapters)


def _activate(layer: torch.nn.Module, adapters: list[str]) -> None:
    """Set a LoRA layer's active adapters for a pass, leaving their requires_grad alone (PEFT's `set_adapter` would
    also freeze every other adapter's parameters)."""
    setattr(layer, "_active_adapter", adapters)


def _forward(layer: torch.nn.Module, original: Callable[..., torch.Tensor], state: _Pass, x: torch.Tensor,
             *args: Any, **kwargs: Any) -> torch.Tensor:
    if state.inside:
        return original(layer, x, *args, **kwargs)
    per_row, rest = divmod(x.shape[0], state.rows)
    if rest or not per_row:
        raise SegmentsUnsupported(
            f"{type(layer).__name__} got {x.shape[0]} leading entries for {state.rows} rows"
        )
    spans = [(b.adapter, b.start * per_row, b.stop * per_row) for b in state.blocks]
    if isinstance(layer, LoraLinear) and not layer.merged and not any(a in layer.lora_variant for a, _, _ in spans):
        return _linear(layer, x, spans, args, kwargs)
    return _per_block(layer, original, state, x, spans, args, kwargs)


def _linear(layer: LoraLinear, x: torch.Tensor, spans: list[tuple[str, int, int]], args: tuple,
            kwargs: dict[str, Any]) -> torch.Tensor:
    """PEFT's `Linear.forward` for one adapter, each block's own: the base once, the low-rank updates per block.
    Where every block's adapter is a plain LoRA in float32, each block runs instead through the node a run alone
    takes (`lean_body.lean_output`: its rows then round as alone).

    Blocks are cut with `split` (its backward is one concatenation; slicing each block would zero-fill a
    whole-batch gradient per block) and joined with one `cat`."""
    sizes = [stop - start for _, start, stop in spans]
    lean = _lean_blocks(layer, x, spans, sizes, args, kwargs)
    if lean is not None:
        return torch.cat(lean)
    result = layer.base_layer(x, *args, **kwargs)
    if not any(adapter in layer.lora_A for adapter, _, _ in spans):
        return result
    outputs = []
    for (adapter, _, _), rows, base in zip(spans, x.split(sizes), result.split(sizes), strict=True):
        if adapter not in layer.lora_A:
            outputs.append(base)
            continue
        lora_a, lora_b = layer.lora_A[adapter], layer.lora_B[adapter]
        rows = layer._cast_input_dtype(rows, cast(torch.Tensor, lora_a.weight).dtype)
        outputs.append(base + lora_b(lora_a(layer.lora_dropout[adapter](rows))) * layer.scaling[adapter])
    return torch.cat([out.to(result.dtype) for out in outputs])


def _lean_blocks(layer: LoraLinear, x: torch.Tensor, spans: list[tuple[str, int, int]], sizes: list[int],
                 args: tuple, kwargs: dict[str, Any]) -> list[torch.Tensor] | None:
    """Each block's output as alone: through `lean_output` where its adapter is on `layer`, the base layer where
    it is not; None unless every block's adapter there is a plain LoRA (checked before any block runs)."""
    if args or kwargs or layer._forward_hooks or layer._forward_pre_hooks or x.dtype != torch.float32:
        return None
    leans = [plain_adapter(layer, adapter) if adapter in layer.lora_A else None for adapter, _, _ in spans]
    if any(lean is None and adapter in layer.lora_A for lean, (adapter, _, _) in zip(leans, spans, strict=True)):
        return None
    outputs = []
    for lean, rows in zip(leans, x.split(sizes), strict=True):
        out = layer.base_layer(rows) if lean is None else lean_output(lean, rows)
        if out is None:
            return None  # weights lean_output does not take (another dtype, a trained base): the same for every block
        outputs.append(out)
    return outputs


def _per_block(layer: torch.nn.Module, original: Callable[..., torch.Tensor], state: _Pass, x: torch.Tensor,
               spans: list[tuple[str, int, int]], args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
    """The layer once per block, with that block's adapter active on it and on the LoRA layers inside it."""
    nested = lora_layers(layer)
    saved = [_active(m) for m in nested]
    sizes = [stop - start for _, start, stop in spans]
    cut = functools.partial(_cut, leading=x.shape[0], sizes=sizes)
    blocks_args = list(zip(*map(cut, args), strict=True)) if args else [()] * len(spans)
    blocks_kwargs = {key: cut(value) for key, value in kwargs.items()}
    outputs = []
    state.inside = True
    try:
        for index, ((adapter, _, _), rows) in enumerate(zip(spans, x.split(sizes), strict=True)):
            for m in nested:
                _activate(m, [adapter])
            outputs.append(original(layer, rows, *blocks_args[index],
                                    **{key: value[index] for key, value in blocks_kwargs.items()}))
    finally:
        state.inside = False
        for m, active in zip(nested, saved, strict=True):
            _activate(m, active)
    return torch.cat(outputs)


def _cut(value: Any, *, leading: int, sizes: list[int]) -> list[Any]:
    """`value` per block: a tensor whose leading dimension is the input's (or a multiple of it: entries per row)
    split like it, anything else as it is."""
    if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] % leading == 0:
        per_entry = value.shape[0] // leading
        return list(value.split([size * per_entry for size in sizes]))
    return [value] * len(sizes)
