"""One run's model sharded over the worker group with FSDP2, for a base too big to hold whole on a worker.

`policy.py` picks this for a base model that does not fit on each worker (or always, with
`--trainer-shard-base always`). A `ShardedTorchBackend` hosts exactly one run: the base model is loaded, the
run's PEFT LoRA adapter is added (seeded identically on every rank), and then `fully_shard` is applied to
every transformer block (the model's `_no_split_modules`) and to the root. So the frozen base, the LoRA
tensors and AdamW's moments are all sharded over the group; forward and backward all-gather a block's
parameters when they need them (each pass, twice), and backward reduce-scatters the LoRA gradients.

Losses are SUMS over tokens (`losses.py`), and each rank runs its share of the datums, so gradients must be
summed across ranks, not averaged: every FSDP module divides by 1 and reduces with a plain SUM (gloo has
no pre-multiplied sum). The sum of the ranks' losses and the gradients then equal a one-process run.

Every rank must run the same collectives in the same order: the ranks agree on the most passes any of them
runs for a step, and a rank with fewer (or no datums) runs passes on one token whose loss is multiplied by
zero (`idle_pass`) after its own.

Each run holds its own sharded copy of the base model (1/N of it on each worker): adapters cannot be added
to a model FSDP has already sharded. The engines' self-check (`base_logprobs`) shards a copy with no adapter
for its one call (`sharded_base_logprobs`), which is dropped after it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, fully_shard

from tx.backends.losses import get_loss
from tx.backends.torch.batch import prepare_data
from tx.backends.torch.lora import AdapterHost
from tx.backends.torch.model import load_causal_lm
from tx.backends.torch.optim import new_optimizer
from tx.backends.torch.logit_cap import choose_logit_cap
from tx.backends.torch.packing import choose_packing
from tx.backends.torch.workers.rank_backend import RankTorchBackend
from tx.multimodal import audio_spec, vision_processor
from tx.optimizers import ADAMW, OptimizerConfig
from tx.types import BaseLogprobs, ForwardBackwardInput, ForwardBackwardResult, LoraConfig


class ShardedTorchBackend(RankTorchBackend):
    def _host(self, base_model: str) -> AdapterHost:
        """The base model, loaded on the CPU: `fully_shard` moves each block's shard to the device, so a model
        larger than one GPU never lands whole on one."""
        if base_model not in self._hosts:
            dtype, checkpointing = (
                self._torch_dtype(),
                bool(self.settings.gradient_checkpointing),
            )
            path = self._paths[base_model]
            model = load_causal_lm(path, torch.device("cpu"), dtype, checkpointing,
                                   self.settings.attn_implementation, runs_on=self.device)
            packing = choose_packing(model, vision_processor(path) is not None, base_model)
            self._hosts[base_model] = AdapterHost(model, packing, choose_logit_cap(model, base_model))
        return self._hosts[base_model]

    def create_model(self, model_id: str, base_model: str, lora: LoraConfig,
                     optimizer: OptimizerConfig = ADAMW) -> None:
        super().create_model(model_id, base_model, lora, optimizer)
        run = self._runs[model_id]
        host = self._hosts[base_model]
        host.activate(run.adapter)
        shard(host.model)
        run.params = host.parameters(run.adapter)  # FSDP replaced them with sharded ones
        run.optimizer = new_optimizer(run.params.values())
        dtype, checkpointing = self._torch_dtype(), bool(self.settings.gradient_checkpointing)
        self._budgets[base_model] = self._budget(
            host.model, dtype, checkpointing
        )  # with 1/N of the model here

    def sharded_base_logprobs(self, base_model: str, sequences: Sequence[Sequence[int]]) -> BaseLogprobs:
        """`base_logprobs` on the base sharded over the group with no adapter, in a backend that hosts no run (its
        copy is dropped with it). Every rank calls it with the same sequences: each forward all-gathers."""
        shard(self._host(base_model).model)
        return self.base_logprobs(base_model, sequences)

    def forward_backward(self, model_id: str, batch: ForwardBackwardInput) -> ForwardBackwardResult:
        """This rank's share of a step, padded with idle passes to as many passes as the busiest rank runs."""
        mine = self.passes(model_id, batch)
        most = torch.tensor([mine], device=self.device)
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        result = super().forward_backward(model_id, batch)
        for _ in range(int(most.item()) - mine):
            self.idle_pass(model_id, backward=not batch.forward_only)
        return result

    def passes(self, model_id: str, batch: ForwardBackwardInput) -> int:
        """How many micro-batches (passes, each all-gathering every block) the trainer runs for `batch`."""
        if not batch.data:
            return 0
        run = self._run(model_id)
        info, vision = self.base_model_info(run.base_model), vision_processor(self._paths[run.base_model])
        loss = get_loss(batch.loss_fn)
        items = prepare_data(
            batch.data, loss, info, vision, self._image_limits, self.settings.max_sequence_tokens,
            audio_spec(self._paths[run.base_model]),
        )
        return len(self._plan(run.base_model, items))

    def idle_pass(self, model_id: str, *, backward: bool) -> None:
        """A pass on one token that adds nothing: it keeps this rank in step with ranks that have data."""
        run = self._run(model_id)
        host = self._hosts[run.base_model]
        host.activate(run.adapter)
        tokens = torch.zeros((1, 1), dtype=torch.long, device=self.device)
        with torch.set_grad_enabled(backward):
            zero = host.unembedding(host.hidden_states(tokens)).sum() * 0.0
        if backward:
            zero.backward()


def shard(model: torch.nn.Module) -> None:
    """FSDP2 over every transformer block (the model's `_no_split_modules`) and the root, the module a pass calls
    (`AdapterHost.hidden_states`); gradients are reduced by plain sums (the module docstring)."""
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in blocks:
            fully_shard(module)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
