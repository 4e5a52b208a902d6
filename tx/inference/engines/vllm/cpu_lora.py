"""A request without an adapter takes none on vLLM's CPU platform too: tx's fix to vLLM's PyTorch LoRA ops.

vLLM gives a row (a token, or a request for the logits) that takes no adapter the LoRA slot index -1. Its GPU
kernels skip such rows. The PyTorch ops its CPU platform runs (`vllm.lora.ops.torch_ops`, vLLM 0.27-0.32)
gather the adapter weights with that index, and -1 picks the LAST slot of `--max-loras`: once an adapter sits
there (or sat there: a freed slot keeps its weights), a base-model request's logits take that adapter's
`lm_head` delta, and in a batch mixing base and adapter requests its linear layers take its deltas too. The
answer is wrong tokens and logprobs, and no error.

`skip_rows_without_adapter` wraps the three ops that gather (`bgmv_shrink`, `bgmv_expand`,
`bgmv_expand_slice`; the `sgmv_*` ops call them) wherever vLLM imported them, so a row with index -1 gets a
zero delta, as on a GPU. `worker.py` applies it in every vLLM worker process, before vLLM builds its LoRA
layers; rows with an adapter are computed exactly as before. It also gives every row an index where vLLM
passes one per request for the rows of several requests' prompt logprobs (`_per_row`).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch

OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")
_TORCH_OPS = "vllm.lora.ops.torch_ops.lora_ops"
_IMPORTERS = ("vllm.lora.ops.torch_ops", "vllm.lora.punica_wrapper.punica_cpu")  # `from ... import bgmv_*`
_MARK = "_tx_skips_rows_without_adapter"


def skip_rows_without_adapter() -> bool:
    """Wrap vLLM's PyTorch gathering LoRA ops (idempotent). False where this vLLM has no such ops."""
    try:
        ops = importlib.import_module(_TORCH_OPS)
    except ImportError:
        return False
    modules = [ops]
    for name in _IMPORTERS:
        try:
            modules.append(importlib.import_module(name))
        except ImportError:
            continue
    for name in OPS:
        original = getattr(ops, name)
        if getattr(original, _MARK, False):
            continue
        wrapped = rows_without_adapter_skipped(original)
        for module in modules:
            if getattr(module, name, None) is original:
                setattr(module, name, wrapped)
    return True


def rows_without_adapter_skipped(op: Callable[..., Any]) -> Callable[..., Any]:
    """`op(inputs, weights, output, indices, ...)` with the input rows of index -1 zeroed (and their index
    clamped to a real slot), so their delta is zero: a shrink writes 0, an expand adds 0."""

    @functools.wraps(op)
    def run(inputs: torch.Tensor, weights: torch.Tensor, output: torch.Tensor, indices: torch.Tensor,
            *args: Any, **kwargs: Any) -> Any:
        indices = _per_row(inputs, indices)
        without = indices < 0
        if bool(without.any()):
            inputs = inputs.masked_fill(without.unsqueeze(-1), 0)
            indices = indices.clamp(min=0)
        return op(inputs, weights, output, indices, *args, **kwargs)

    setattr(run, _MARK, True)
    return run


def _per_row(inputs: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """One index per input row. For a batch's prompt logprobs, vLLM's CPU logits path passes the prompt rows of
    every request but one index per request (its `sampler_indices`), and the op failed (`The size of tensor a
    (2) must match the size of tensor b (15)`: the engine died, and every request in flight with it; found by
    the engines' self-check, `tx/inference/manager/selfcheck.py`). Where every request takes the same slot (all
    without an adapter, the common case), every row takes it; else the rows cannot be told apart here, and the
    op fails as vLLM's own does."""
    rows = inputs.shape[0]
    if indices.shape[0] in (1, rows) or not bool((indices == indices[:1]).all()):
        return indices
    return indices[:1].expand(rows)
