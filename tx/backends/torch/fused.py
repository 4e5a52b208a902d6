"""Training passes on one base model for one run's request or several runs' at once.

`run_calls` cuts the calls' datums (each call's in order, the calls one after another) into micro-batches of
the token budget. A micro-batch holding one call's datums runs as that call alone would (`step.run_micro_batch`);
one holding several calls' datums runs them in ONE forward and backward (`run_parts`): each call's datums are
laid into rows as alone (`build_micro_batch`), the calls' rows are stacked (`Rows`: right-padded to one width,
which a causal model never looks at) and go through the body once, each block of rows through its own run's
adapter (`segments.py`); then each call's positions get its own run's head, its own loss and its own backward,
and one backward through the body carries every call's gradient into its own run's LoRA. Results equal each
call alone (rows never see each other): `tests/unit/backends/test_fused_pass.py` holds that to 1e-5 in float32.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tx.backends.losses import LossFn
from tx.backends.torch.batch import MicroBatch, PreparedDatum, build_micro_batch
from tx.backends.torch.custom_loss import CompiledLoss, reduce_metrics, run_on_data
from tx.backends.torch.custom_loss_limits import LossBudget
from tx.backends.torch.lora import AdapterHost
from tx.backends.torch.plan import plan_micro_batches
from tx.backends.torch.segments import Block, lora_layers, only, segmented
from tx.backends.torch.step import CustomStep, MicroResult, head_step, run_micro_batch
from tx.multimodal import VisionProcessor
from tx.types import Datum, ForwardBackwardResult


@dataclass(frozen=True)
class Call:
    """One run's forward_backward (or forward), checked and ready to run."""

    adapter: str
    items: list[PreparedDatum]
    data: list[Datum]
    loss_fn: LossFn
    config: Mapping[str, float]
    custom: CompiledLoss | None
    forward_only: bool


@dataclass
class _Outcome:
    outputs: list[dict[str, Any]]
    loss: float = 0.0
    sums: dict[str, float] = field(default_factory=dict)

    def add(self, indices: list[int], result: MicroResult) -> None:
        for index, logprobs in zip(indices, result.logprobs, strict=True):
            self.outputs[index]["logprobs"] = logprobs
        self.loss += result.loss
        self.sums = {key: self.sums.get(key, 0.0) + value for key, value in result.metrics.items()}

    def result(self) -> ForwardBackwardResult:
        metrics = {"loss:sum": self.loss, **reduce_metrics(self.sums, len(self.outputs))}
        return ForwardBackwardResult(loss_fn_outputs=self.outputs, metrics=metrics)


@dataclass(frozen=True)
class Part:
    """One call's datums in one micro-batch."""

    call: Call
    micro: MicroBatch
    custom: CustomStep | None


def run_calls(host: AdapterHost, calls: Sequence[Call], budget: int, device: torch.device,
              vision: VisionProcessor | None) -> list[ForwardBackwardResult]:
    """Every call's result, in order; all calls are forward-only or none is. Gradients accumulate in each
    call's run; a failure (out of memory) leaves them half-accumulated: the caller restores them."""
    order = [(c, i) for c, call in enumerate(calls) for i in range(len(call.items))]
    groups = plan(host, [calls[c].items[i] for c, i in order], budget)
    outcomes = [_Outcome([{} for _ in call.items]) for call in calls]
    limits = [LossBudget() for _ in calls]  # each call's custom loss's limits, over all its micro-batches
    for group in groups:
        taken: dict[int, list[int]] = {}  # call -> its datums in this micro-batch
        for position in group:
            c, i = order[position]
            taken.setdefault(c, []).append(i)
        packed = host.packing != "padded"
        parts = [_part(calls[c], indices, device, vision, limits[c], packed) for c, indices in taken.items()]
        for (c, indices), result in zip(taken.items(), run_parts(host, parts), strict=True):
            outcomes[c].add(indices, result)
        del parts
    return [outcome.result() for outcome in outcomes]


def plan(host: AdapterHost, items: Sequence[PreparedDatum], budget: int) -> list[list[int]]:
    """The micro-batches of `items` (indices), for the host's rows: packed, or padded (`packing.py`)."""
    return plan_micro_batches([item.num_tokens for item in items], budget, host.packing == "padded")


def _part(call: Call, indices: list[int], device: torch.device, vision: VisionProcessor | None,
          limits: LossBudget, packed: bool) -> Part:
    micro = build_micro_batch([call.items[i] for i in indices], device, vision, packed=packed)
    return Part(call, micro, _custom_step(call, indices, device, limits))


def _custom_step(call: Call, indices: list[int], device: torch.device, limits: LossBudget) -> CustomStep | None:
    """An uploaded loss on these datums' logprobs, within the call's `limits` (None: its built-in loss)."""
    compiled = call.custom
    if compiled is None:
        return None
    inputs = [call.data[i].loss_fn_inputs for i in indices]
    return lambda logprobs: run_on_data(compiled, logprobs, inputs, device, limits)


def run_parts(host: AdapterHost, parts: Sequence[Part]) -> list[MicroResult]:
    """One micro-batch: a single call's alone, several calls' in one pass (module docstring)."""
    forward_only = parts[0].call.forward_only
    if len(parts) == 1:
        part = parts[0]
        return [run_micro_batch(host, part.call.adapter, part.micro, part.call.loss_fn, part.call.config,
                                forward_only, part.custom)]
    rows = Rows.of([part.micro for part in parts])
    blocks = [Block(part.call.adapter, start, stop) for part, (start, stop) in zip(parts, rows.spans, strict=True)]
    host.activate_many([block.adapter for block in blocks])
    unembedding = host.unembedding
    head = lora_layers(unembedding)
    results = []
    with segmented(lora_layers(host.peft_model, skip=unembedding), blocks, rows.count), \
            torch.no_grad() if forward_only else torch.enable_grad():
        hidden = host.hidden_states(rows.input_ids, position_ids=rows.position_ids,
                                    attention_mask=rows.attention_mask, vision=rows.vision)
        # each call's rows as a leaf of its own: its head's backward lands there, then the body's runs once
        leaves = [rows_.detach().requires_grad_(not forward_only) for rows_ in hidden.split(rows.counts)]
        for part, block, leaf in zip(parts, blocks, leaves, strict=True):
            mine = leaf[:, : part.micro.input_ids.shape[1]].flatten(0, 1).index_select(0, part.micro.index)
            with only(head, block.adapter):
                results.append(head_step(host, mine, part.micro, part.call.loss_fn, part.call.config,
                                         forward_only, part.custom))
        if not forward_only and hidden.requires_grad:
            hidden.backward(torch.cat([_grad(leaf) for leaf in leaves]))
    return results


@dataclass(frozen=True)
class Rows:
    """Several micro-batches' model inputs stacked: each one's rows right-padded to the widest, in order."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor | None
    attention_mask: torch.Tensor | None
    vision: dict[str, torch.Tensor]
    spans: list[tuple[int, int]]  # each micro-batch's rows

    @property
    def count(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def counts(self) -> list[int]:
        return [stop - start for start, stop in self.spans]

    @classmethod
    def of(cls, micros: Sequence[MicroBatch]) -> Rows:
        width = max(int(m.input_ids.shape[1]) for m in micros)
        counts = [int(m.input_ids.shape[0]) for m in micros]
        starts = np.cumsum([0, *counts]).tolist()
        packed = micros[0].position_ids is not None
        masks = None
        if not packed and any(m.attention_mask is not None for m in micros):
            masks = torch.cat([_pad(_mask(m), width, 0) for m in micros])
        return cls(
            input_ids=torch.cat([_pad(m.input_ids, width, 0) for m in micros]),
            position_ids=torch.cat([_pad_positions(_positions(m), width) for m in micros]) if packed else None,
            attention_mask=masks,
            vision=_stack_vision(micros, width),
            spans=list(itertools.pairwise(starts)),
        )


def _grad(leaf: torch.Tensor) -> torch.Tensor:
    return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)


def _positions(micro: MicroBatch) -> torch.Tensor:
    assert micro.position_ids is not None, "micro-batches of one base model are all packed or all padded"
    return micro.position_ids


def _mask(micro: MicroBatch) -> torch.Tensor:
    if micro.attention_mask is not None:
        return micro.attention_mask
    return torch.ones_like(micro.input_ids)


def _pad(rows: torch.Tensor, width: int, value: int) -> torch.Tensor:
    return torch.nn.functional.pad(rows, (0, width - rows.shape[1]), value=value)


def _pad_positions(positions: torch.Tensor, width: int) -> torch.Tensor:
    """A packed row's tail as one more padding segment of its own (position ids from 0), as `plan.py` lays it."""
    extra = width - positions.shape[1]
    tail = torch.arange(extra, dtype=positions.dtype, device=positions.device).expand(positions.shape[0], extra)
    return torch.cat([positions, tail], dim=1)


def _stack_vision(micros: Sequence[MicroBatch], width: int) -> dict[str, torch.Tensor]:
    """Image inputs in row order: per-row token types padded and stacked (zeros for a micro-batch without
    images), the rest (pixels, image grids: one entry per image, images in row order) concatenated."""
    stacked = {}
    for key in sorted({key for m in micros for key in m.vision}):
        having = [m for m in micros if key in m.vision]
        if all(not m.vision[key].is_floating_point() and m.vision[key].shape == m.input_ids.shape for m in having):
            rows = [m.vision.get(key, torch.zeros_like(m.input_ids)) for m in micros]
            stacked[key] = torch.cat([_pad(r, width, 0) for r in rows])
        else:
            stacked[key] = torch.cat([m.vision[key] for m in having])
    return stacked
