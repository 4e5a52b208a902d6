"""`TorchBackend`: Hugging Face causal LMs with PEFT LoRA runs, trained with AdamW.

One base model is loaded per served name (on the first run created on it) and shared by every
run on it; each run is a named PEFT adapter with its own AdamW (see `lora.py`). A request is one
padded forward pass over all its datums; gradients accumulate in the run's LoRA parameters until
`optim_step`. The core calls these methods from one thread, one at a time.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from tx.backends.base import TrainingBackend
from tx.backends.losses import get_loss
from tx.backends.torch import checkpoint
from tx.backends.torch.batch import pack_batch
from tx.backends.torch.logprobs import target_logprobs
from tx.backends.torch.lora import AdapterHost
from tx.backends.torch.model import load_causal_lm, read_model_info, resolve_device
from tx.backends.torch.ops import TORCH_OPS
from tx.backends.torch.optim import adam_step, new_optimizer
from tx.backends.torch.run import Run
from tx.multimodal import ImageLimits, vision_processor
from tx.types import (
    AdamParams,
    BaseModelInfo,
    ConflictError,
    ForwardBackwardInput,
    ForwardBackwardResult,
    LoraConfig,
    NotFoundError,
    OptimStepResult,
    UserError,
)

logger = logging.getLogger(__name__)


class TorchBackend(TrainingBackend):
    def __init__(
        self, models: dict[str, Path], *, device: str = "auto", image_limits: ImageLimits | None = None
    ) -> None:
        """`models` maps each served base-model name to a local HF model directory; `image_limits` caps
        the images in training data (vision-language models)."""
        self._paths = {name: Path(path) for name, path in models.items()}
        self.device = resolve_device(device)
        self._image_limits = image_limits or ImageLimits()
        self._infos: dict[str, BaseModelInfo] = {}
        self._hosts: dict[str, AdapterHost] = {}
        self._runs: dict[str, Run] = {}

    def training_device(self) -> str:
        return str(self.device)

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

    def _host(self, base_model: str) -> AdapterHost:
        if base_model not in self._hosts:
            self._hosts[base_model] = AdapterHost(load_causal_lm(self._paths[base_model], self.device))
        return self._hosts[base_model]

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
        loss_fn = get_loss(batch.loss_fn)
        config = loss_fn.resolve_config(batch.loss_fn_config)
        info, vision = self.base_model_info(run.base_model), vision_processor(self._paths[run.base_model])
        packed = pack_batch(batch.data, loss_fn, info, self.device, vision, self._image_limits)
        host = self._hosts[run.base_model]
        host.activate(run.adapter)
        with torch.no_grad() if batch.forward_only else nullcontext():
            logits = host.logits(packed.input_ids, packed.attention_mask, packed.vision)
            logp = target_logprobs(logits, packed.targets)
            del logits
            terms = loss_fn.compute(TORCH_OPS, logp, packed.inputs, config)
            loss = torch.where(packed.mask, terms, 0.0).sum()
        if not batch.forward_only:
            loss.backward()
        outputs = [{"logprobs": lp} for lp in packed.split(logp)]
        metrics = {"loss:sum": float(loss.detach())}
        elapsed = time.perf_counter() - start
        logger.debug("forward_backward %s: %d datums in %.3fs", model_id, len(outputs), elapsed)
        return ForwardBackwardResult(loss_fn_outputs=outputs, metrics=metrics)

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
        _check_compatible(run, base_model, lora, directory)
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


def _check_compatible(run: Run, base_model: str, lora: LoraConfig, directory: Path) -> None:
    if base_model != run.base_model:
        raise UserError(f"checkpoint {directory} is for base model {base_model!r}, not {run.base_model!r}")
    mine = (run.lora.rank, run.lora.train_attn, run.lora.train_mlp, run.lora.train_unembed)
    theirs = (lora.rank, lora.train_attn, lora.train_mlp, lora.train_unembed)
    if mine != theirs:
        raise UserError(f"checkpoint {directory} has LoRA config {lora}, which does not fit {run.lora}")


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
