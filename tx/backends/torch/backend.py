"""`TorchBackend`: Hugging Face causal LMs with PEFT LoRA runs, trained with AdamW.

One base model is loaded per served name (on the first run created on it) and shared by every
run on it; each run is a named PEFT adapter with its own AdamW (see `lora.py`). A request is validated
whole, then cut into micro-batches of at most `micro_batch_tokens` tokens (`plan.py`), each packed into
rows (`batch.py`) and run by `step.run_micro_batch`: the body, a chunked head that never holds tokens x
vocab logits (`logprobs.py`), the loss and its backward. Gradients accumulate in the run's LoRA
parameters until `optim_step`. The core calls these methods from one thread, one at a time.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tx.backends.base import TrainingBackend
from tx.backends.datums import DatumRules, check_custom_inputs
from tx.backends.lora_files import check_compatible
from tx.backends.losses import batch_loss
from tx.backends.torch import checkpoint
from tx.backends.torch.batch import PreparedDatum, build_micro_batch, prepare_data
from tx.backends.torch.custom_loss import (
    CompiledLoss,
    compile_loss,
    reduce_metrics,
    run_on_data,
)
from tx.backends.torch.custom_loss_limits import LossBudget
from tx.backends.torch.lora import AdapterHost
from tx.backends.torch.memory import (
    OUT_OF_MEMORY,
    TrainerOutOfMemory,
    out_of_memory_message,
    release,
    return_freed_tensors_to_os,
)
from tx.backends.torch.model import load_causal_lm, read_model_info
from tx.backends.torch.optim import adam_step, new_optimizer
from tx.backends.torch.packing import choose_packing
from tx.backends.torch.plan import plan_micro_batches
from tx.backends.torch.run import Run
from tx.backends.torch.settings import CPU_MICRO_BATCH_TOKENS
from tx.backends.torch.step import CustomStep, run_micro_batch
from tx.config.sections import TrainerSection
from tx.multimodal import ImageLimits, vision_processor
from tx.devices import resolve_device
from tx.types import (
    AdamParams,
    BaseModelInfo,
    ConflictError,
    CustomLoss,
    Datum,
    ForwardBackwardInput,
    ForwardBackwardResult,
    LoraConfig,
    NotFoundError,
    OptimStepResult,
    UserError,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)


class TorchBackend(TrainingBackend):
    def __init__(
        self,
        models: dict[str, Path],
        *,
        device: str = "auto",
        image_limits: ImageLimits | None = None,
        settings: TrainerSection | None = None,
    ) -> None:
        """`models` maps each served base-model name to a local HF model directory; `image_limits` caps
        the images in training data (vision-language models); `settings` the micro-batch budget, dtype
        and checkpointing (defaults chosen for the device)."""
        self._paths = {name: Path(path) for name, path in models.items()}
        self.device = resolve_device(device)
        self.settings = (settings or TrainerSection()).resolved(self.device.type)
        if self.device.type == "cpu":
            return_freed_tensors_to_os()  # activations live in host memory: keep the peak bounded
        self._budgets: dict[str, int] = {}
        self._image_limits = image_limits or ImageLimits()
        self._infos: dict[str, BaseModelInfo] = {}
        self._hosts: dict[str, AdapterHost] = {}
        self._runs: dict[str, Run] = {}

    def training_device(self) -> str:
        return str(self.device)

    def use_threads(self, threads: int) -> None:
        # torch's intra-op pool size is per calling thread once it has run an op: set it here, on the training
        # thread, never from another
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    # ---- base models ----

    def base_model_info(self, base_model: str) -> BaseModelInfo:
        if base_model not in self._paths:
            served = sorted(self._paths)
            raise NotFoundError(f"base model {base_model!r} is not served here (served: {served})")
        if base_model not in self._infos:
            self._infos[base_model] = read_model_info(base_model, self._paths[base_model])
        return self._infos[base_model]

    def served_models(self) -> list[BaseModelInfo]:
        return [self.base_model_info(name) for name in self._paths]

    def datum_rules(self, base_model: str) -> DatumRules:
        info, model_dir = self.base_model_info(base_model), self._paths[base_model]
        return DatumRules.of_model_dir(info, model_dir, self.settings.max_sequence_tokens, self._image_limits)

    def _host(self, base_model: str) -> AdapterHost:
        if base_model not in self._hosts:
            dtype = self._torch_dtype()
            checkpointing = bool(self.settings.gradient_checkpointing)
            path = self._paths[base_model]
            model = load_causal_lm(path, self.device, dtype, checkpointing, self.settings.attn_implementation)
            packing = choose_packing(model, vision_processor(path) is not None, base_model)
            self._hosts[base_model] = AdapterHost(model, packing)
            self._budgets[base_model] = self._budget(model, dtype, checkpointing)
            logger.info("%s: micro-batches of up to %d tokens", base_model, self._budgets[base_model])
        return self._hosts[base_model]

    def _plan(self, base_model: str, items: list[PreparedDatum]) -> list[list[int]]:
        """The micro-batches of `items` (indices), for the base model's rows (packed or padded)."""
        padded = self._hosts[base_model].packing == "padded"
        return plan_micro_batches([item.num_tokens for item in items], self._budgets[base_model], padded)

    def _torch_dtype(self) -> torch.dtype:
        """The base weights' dtype (the settings are resolved for the device)."""
        return getattr(torch, str(self.settings.dtype))

    def _budget(self, model: PreTrainedModel, dtype: torch.dtype, checkpointing: bool) -> int:
        if self.settings.micro_batch_tokens is not None:
            return self.settings.micro_batch_tokens
        if self.device.type == "cuda":
            from tx.backends.torch.memory import default_cuda_budget

            return default_cuda_budget(model, self.device, dtype, checkpointing)
        return CPU_MICRO_BATCH_TOKENS

    # ---- runs ----

    def create_model(self, model_id: str, base_model: str, lora: LoraConfig) -> None:
        if model_id in self._runs:
            raise ConflictError(f"model {model_id!r} already exists")
        lora.validate()
        self.base_model_info(base_model)
        adapter = f"run_{uuid.uuid4().hex}"
        params = self._host(base_model).add(adapter, lora)
        optimizer = new_optimizer(params.values())
        self._runs[model_id] = Run(model_id, base_model, lora, adapter, params, optimizer)
        logger.info("created %s on %s (rank %d)", model_id, base_model, lora.rank)

    def has_model(self, model_id: str) -> bool:
        return model_id in self._runs

    def delete_model(self, model_id: str) -> None:
        run = self._run(model_id)
        self._hosts[run.base_model].remove(run.adapter)
        del self._runs[model_id]

    def _run(self, model_id: str) -> Run:
        if model_id not in self._runs:
            raise NotFoundError(f"model {model_id!r} is not loaded")
        return self._runs[model_id]

    # ---- training ----

    def forward_backward(self, model_id: str, batch: ForwardBackwardInput) -> ForwardBackwardResult:
        start = time.perf_counter()
        run = self._run(model_id)
        custom = compile_loss(batch.custom_loss) if batch.custom_loss is not None else None
        limits = LossBudget()  # the custom loss's limits, over every micro-batch of this call
        loss_fn, config = batch_loss(batch)
        info, vision = self.base_model_info(run.base_model), vision_processor(self._paths[run.base_model])
        items = prepare_data(
            batch.data, loss_fn, info, vision, self._image_limits, self.settings.max_sequence_tokens
        )
        if batch.custom_loss is not None:
            check_custom_inputs(batch.custom_loss, batch.data)
        host, budget = self._hosts[run.base_model], self._budgets[run.base_model]
        packed = host.packing != "padded"
        groups = self._plan(run.base_model, items)
        saved = None if batch.forward_only else _grads(run)
        try:
            outputs: list[dict[str, Any]] = [{} for _ in items]
            loss, sums = 0.0, {}
            for group in groups:
                micro = build_micro_batch([items[i] for i in group], self.device, vision, packed=packed)
                step = None if custom is None else _custom_step(custom, [batch.data[i] for i in group], self.device,
                                                                 limits)
                result = run_micro_batch(host, run.adapter, micro, loss_fn, config, batch.forward_only, step)
                for index, logprobs in zip(group, result.logprobs, strict=True):
                    outputs[index]["logprobs"] = logprobs
                loss += result.loss
                sums = {key: sums.get(key, 0.0) + value for key, value in result.metrics.items()}
                del micro, result
        except OUT_OF_MEMORY as exc:
            message = out_of_memory_message(exc, self.device, budget)
        else:
            elapsed = time.perf_counter() - start
            logger.debug("forward_backward %s: %d datums, %d micro-batches in %.3fs",
                         model_id, len(outputs), len(groups), elapsed)
            metrics = {"loss:sum": loss, **reduce_metrics(sums, len(outputs))}
            return ForwardBackwardResult(loss_fn_outputs=outputs, metrics=metrics)
        # outside the except block, so nothing refers to the failed step's frames any more
        if saved is not None:
            _restore_grads(run, saved)
        release(self.device)
        logger.error("forward_backward %s: %s", model_id, message)
        raise TrainerOutOfMemory(message)

    def runs_custom_losses(self) -> bool:
        return True

    def check_custom_loss(self, loss: CustomLoss) -> None:
        compile_loss(loss)

    def optim_step(self, model_id: str, adam: AdamParams) -> OptimStepResult:
        adam.validate()
        return OptimStepResult(metrics=adam_step(self._run(model_id).optimizer, adam))

    # ---- checkpoints ----

    def save_state(self, model_id: str, directory: Path) -> None:
        run = self._run(model_id)
        weights = {name: param.detach() for name, param in run.params.items()}
        checkpoint.write_state(directory, run.base_model, run.lora, weights, run.optimizer.state_dict())

    def load_state(self, model_id: str, directory: Path, *, with_optimizer: bool) -> None:
        """Load weights (and optimizer state) into `model_id`; its pending gradients are dropped.

        Without the optimizer, the run's AdamW starts afresh (moments from other weights would
        not mean anything).
        """
        run = self._run(model_id)
        base_model, lora = self.read_state_config(directory)
        check_compatible(run, base_model, lora, directory)
        weights = checkpoint.read_weights(directory, self.device)
        optimizer_state = checkpoint.read_optimizer_state(directory, self.device) if with_optimizer else None
        _copy_weights(run, weights, directory)
        run.zero_grad()
        run.optimizer = new_optimizer(run.params.values())
        if optimizer_state is not None:
            try:
                run.optimizer.load_state_dict(optimizer_state)
            except (ValueError, KeyError) as exc:
                raise UserError(f"optimizer state in {directory} does not fit {model_id}: {exc}") from exc

    def read_state_config(self, directory: Path) -> tuple[str, LoraConfig]:
        return checkpoint.read_state_config(directory)

    def save_sampler_weights(self, model_id: str, directory: Path) -> None:
        run = self._run(model_id)
        host = self._hosts[run.base_model]
        weights = host.peft_state_dict(run.adapter)
        checkpoint.write_sampler_weights(directory, run.base_model, host.peft_config(run.adapter), weights)

    def gradients(self, model_id: str) -> dict[str, torch.Tensor | None]:
        """The run's accumulated gradients by PEFT file name (None where nothing accumulated yet)."""
        return {name: param.grad for name, param in self._run(model_id).params.items()}

    def iter_trainable_weights(self, model_id: str) -> Iterator[tuple[str, Any]]:
        """The run's live LoRA tensors (detached, not copied), named as in its PEFT adapter file."""
        for name, param in self._run(model_id).params.items():
            yield name, param.detach()


def _custom_step(loss: CompiledLoss, data: list[Datum], device: torch.device, budget: LossBudget) -> CustomStep:
    inputs = [datum.loss_fn_inputs for datum in data]
    return lambda logprobs: run_on_data(loss, logprobs, inputs, device, budget)


def _grads(run: Run) -> dict[str, torch.Tensor | None]:
    """Copies of the run's accumulated gradients (LoRA-sized), to undo a step that fails half-way."""
    return {name: None if p.grad is None else p.grad.clone() for name, p in run.params.items()}


def _restore_grads(run: Run, saved: dict[str, torch.Tensor | None]) -> None:
    for name, param in run.params.items():
        param.grad = saved[name]


def _copy_weights(run: Run, weights: dict[str, torch.Tensor], directory: Path) -> None:
    if set(weights) != set(run.params):
        missing, extra = sorted(set(run.params) - set(weights)), sorted(set(weights) - set(run.params))
        raise UserError(
            f"checkpoint {directory} does not fit the run: missing {missing[:3]}, extra {extra[:3]}"
        )
    for name, param in run.params.items():
        if weights[name].shape != param.shape:
            raise UserError(f"checkpoint {directory}: {name} has shape {tuple(weights[name].shape)}, "
                            f"expected {tuple(param.shape)}")
    with torch.no_grad():
        for name, param in run.params.items():
            param.copy_(weights[name])
