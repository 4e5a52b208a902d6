"""One micro-batch through one run's adapter: the body, the chunked head, the loss, and its backward.

`run_micro_batch` is the unit a trainer process repeats: the single-process backend calls it for each
micro-batch of a request, and a worker holding a shard of the request calls it for each of its own.
Gradients accumulate in the adapter's parameters (`.grad`), so the caller decides when to step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from tx.backends.losses import LossFn
from tx.backends.torch.batch import MicroBatch
from tx.backends.torch.head import Head, lean_head, softcapped
from tx.backends.torch.lean_body import lean_linears
from tx.backends.torch.logprobs import chunk_positions, per_token_backward, target_logprobs
from tx.backends.torch.lora import AdapterHost
from tx.backends.torch.ops import TORCH_OPS


# Losses that are a sum of per-token terms, each a function of that token's logprob and inputs only: their
# head runs forward and backward a chunk at a time (`per_token_backward`). Any other loss (gspo's
# per-sequence ratio, custom losses) takes the general path, which recomputes the chunks' logits.
PER_TOKEN_LOSSES = frozenset({"cross_entropy", "importance_sampling", "ppo", "cispo", "dro"})


@dataclass(frozen=True)
class MicroResult:
    logprobs: list[np.ndarray]  # per datum, float32, in its target shape
    loss: float  # the micro-batch's summed loss
    metrics: dict[str, float] = field(default_factory=dict)  # a custom loss's metric sums


# A custom loss on a micro-batch: its datums' logprobs (each in its target shape) -> (loss, metric sums)
CustomStep = Callable[[list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


def run_micro_batch(
    host: AdapterHost,
    adapter: str,
    micro: MicroBatch,
    loss_fn: LossFn,
    config: Mapping[str, float],
    forward_only: bool,
    custom: CustomStep | None = None,
) -> MicroResult:
    """Forward `micro` through `adapter` on `host`; unless `forward_only`, backward into its LoRA grads.

    With `custom` (an uploaded loss), it replaces `loss_fn` and runs on each datum's logprobs."""
    host.activate(adapter)
    with torch.no_grad() if forward_only else torch.enable_grad(), lean_linears(host.peft_model, host.unembedding):
        hidden = host.hidden_states(
            micro.input_ids,
            position_ids=micro.position_ids,
            attention_mask=micro.attention_mask,
            vision=micro.vision,
        )
        hidden = hidden.flatten(0, 1).index_select(0, micro.index)  # real positions only, in datum order
        return head_step(host, hidden, micro, loss_fn, config, forward_only, custom)


def head_step(
    host: AdapterHost,
    hidden: torch.Tensor,
    micro: MicroBatch,
    loss_fn: LossFn,
    config: Mapping[str, float],
    forward_only: bool,
    custom: CustomStep | None = None,
) -> MicroResult:
    """From `micro`'s final hidden states (N, H), in datum order: the head, the loss, and (unless `forward_only`)
    the backward into the active adapter's head and through `hidden`."""
    chunk = chunk_positions(host.vocab_size)
    unembed = lean_head(host.unembedding)  # its LoRA from the weights when plain (`head.py`)
    unembed = softcapped(unembed, host.logit_cap)  # where the model softcaps its logits (`logit_cap.py`)
    with torch.no_grad() if forward_only else torch.enable_grad():
        if not forward_only and custom is None and loss_fn.name in PER_TOKEN_LOSSES:
            return _per_token_step(hidden, unembed, micro, loss_fn, config, chunk)
        logp = target_logprobs(hidden, unembed, micro.targets, chunk)
        logp = micro.to_rows(logp)  # (D, T, K): one datum per row, as the losses expect
        metrics: dict[str, float] = {}
        if custom is not None:
            loss, metrics = custom(micro.split_tensors(logp))
        else:
            terms = loss_fn.compute(TORCH_OPS, logp, micro.inputs, config)
            loss = torch.where(micro.mask, terms, 0.0).sum()
    if not forward_only:
        loss.backward()
    return MicroResult(micro.split(logp), float(loss.detach()), metrics)


def _per_token_step(
    hidden: torch.Tensor,
    unembed: Head,
    micro: MicroBatch,
    loss_fn: LossFn,
    config: Mapping[str, float],
    chunk: int,
) -> MicroResult:
    """The head's forward and backward a chunk at a time (`per_token_backward`), then the body's backward."""
    flat_inputs = {key: micro.flat(value) for key, value in micro.inputs.items()}
    flat_mask = micro.flat(micro.mask)

    def chunk_loss(logp: torch.Tensor, rows: slice) -> torch.Tensor:
        terms = loss_fn.compute(TORCH_OPS, logp, {k: v[rows] for k, v in flat_inputs.items()}, config)
        return torch.where(flat_mask[rows], terms, 0.0).sum()

    logp, loss, grad = per_token_backward(hidden, unembed, micro.targets, chunk, chunk_loss)
    if hidden.requires_grad:  # False when only the unembedding has a LoRA
        hidden.backward(grad)
    return MicroResult(micro.split(micro.to_rows(logp)), float(loss))
