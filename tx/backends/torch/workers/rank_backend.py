"""`RankTorchBackend`: the ordinary torch trainer on one rank of the worker group, plus what the group needs.

Each worker runs the trainer code of `tx/backends/torch/backend.py` on its share of a step's datums. Two
kinds of rank backend exist, chosen per base model by `policy.py`: `replicated.py` (every worker holds the
whole frozen base; the LoRA gradients are summed once per `optim_step`) and `sharded.py` (FSDP2 shards the
base, LoRA and AdamW over the group). This base class holds what both share: a step with no datums here,
and reading or setting a run's whole LoRA tensors and AdamW state for checkpoints (tensors may be sharded
`DTensor`s; for a replicated run they are plain tensors and nothing is communicated).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from tx.backends.torch.backend import TorchBackend, _copy_weights
from tx.backends.torch.optim import new_optimizer
from tx.types import ForwardBackwardInput, ForwardBackwardResult, UserError


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly sharded) one; a collective when it is sharded."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def like(value: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`value` (the whole tensor, the same on every rank) sharded as `param` is; no communication."""
    if isinstance(param, DTensor) and value.shape == param.shape:
        return distribute_tensor(
            value.to(param.device), param.device_mesh, param.placements, src_data_rank=None
        )
    return value


class RankTorchBackend(TorchBackend):
    def forward_backward(self, model_id: str, batch: ForwardBackwardInput) -> ForwardBackwardResult:
        """The trainer on this rank's share of the datums (none: a zero loss and no outputs)."""
        if not batch.data:
            return ForwardBackwardResult(loss_fn_outputs=[], metrics={"loss:sum": 0.0})
        return super().forward_backward(model_id, batch)

    def forward_backward_many(
        self, calls: Sequence[tuple[str, ForwardBackwardInput]]
    ) -> list[ForwardBackwardResult | Exception]:
        """The calls with datums here share passes; one with none answers a zero loss."""
        busy = [(model_id, batch) for model_id, batch in calls if batch.data]
        done = iter(super().forward_backward_many(busy))
        idle = ForwardBackwardResult(loss_fn_outputs=[], metrics={"loss:sum": 0.0})
        return [next(done) if batch.data else idle for _, batch in calls]

    def lora_weights(self, model_id: str) -> dict[str, torch.Tensor]:
        """The run's whole LoRA tensors by PEFT file name (collective when sharded: every rank calls it)."""
        return {name: full(param.detach()) for name, param in self._run(model_id).params.items()}

    def optimizer_state(self, model_id: str) -> dict:
        """The run's whole AdamW state dict (collective when sharded)."""
        state = self._run(model_id).optimizer.state_dict()
        state["state"] = {i: {k: full(v) for k, v in entry.items()} for i, entry in state["state"].items()}
        return state

    def write_weights(
        self, model_id: str, weights: dict[str, torch.Tensor], optimizer_state: dict | None, directory: Path
    ) -> None:
        """Set the run's LoRA tensors (and AdamW state, else a fresh AdamW) from checkpoint `directory`;
        gradients are dropped.

        Every rank gets the same whole tensors and keeps its own shard of them (or all of them), so this
        needs no collective, and a bad checkpoint fails the same way on every rank."""
        run = self._run(model_id)
        shards = {
            name: like(value, run.params[name]) if name in run.params else value
            for name, value in weights.items()
        }
        _copy_weights(run, shards, directory)
        run.zero_grad()
        run.optimizer = new_optimizer(run.params.values())
        if optimizer_state is None:
            return
        params = list(run.params.values())
        try:
            for index, entry in optimizer_state["state"].items():
                for key, value in entry.items():
                    entry[key] = like(value, params[index])
            run.optimizer.load_state_dict(optimizer_state)
        except (ValueError, KeyError, IndexError, RuntimeError) as exc:
            raise UserError(f"optimizer state in {directory} does not fit {model_id}: {exc}") from exc
