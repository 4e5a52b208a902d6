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
from tx.backends.torch.logprobs import chunk_positions, target_logprobs
from tx.backends.torch.lora import AdapterHost
from tx.backends.torch.ops import TORCH_OPS


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
    with torch.no_grad() if forward_only else torch.enable_grad():
        hidden = host.hidden_states(
            micro.input_ids,
            position_ids=micro.position_ids,
            attention_mask=micro.attention_mask,
            vision=micro.vision,
        )
        hidden = hidden.flatten(0, 1).index_select(0, micro.index)  # real positions only, in datum order
        logp = target_logprobs(hidden, host.unembedding, micro.targets, chunk_positions(host.vocab_size))
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
