"""`TorchBackend`: Hugging Face causal LMs with PEFT LoRA runs, trained with AdamW or Dimuon.

One base model is loaded per served name (on the first run created on it) and shared by every
run on it; each run is a named PEFT adapter with its own optimizer (see `lora.py`, `optim.py`). A request
is validated whole, then cut into micro-batches of at most `micro_batch_tokens` tokens (`plan.py`), each
laid into rows (`batch.py`) and run by `fused.run_calls`: the body, a chunked head that never holds
tokens x vocab logits (`logprobs.py`), the loss and its backward; several runs' calls on one base model
share each pass (`forward_backward_many`). Gradients accumulate in the run's LoRA parameters until
`optim_step`. The core calls these methods from one thread, one at a time.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from tx.backends.base import TrainingBackend
from tx.backends.datums import DatumRules, check_custom_inputs
from tx.backends.lora_files import check_compatible
from tx.backends.losses import batch_loss
from tx.backends.torch import checkpoint
from tx.backends.torch.batch import PreparedDatum, prepare_data
from tx.backends.torch.custom_loss import compile_loss
from tx.backends.torch.fused import Call, plan, run_calls
from tx.backends.torch.fusion_check import fuses_exactly
from tx.backends.torch.logit_cap import choose_logit_cap
from tx.backends.torch.lora import AdapterHost
from tx.backends.torch.memory import (
    OUT_OF_MEMORY,
    TrainerOutOfMemory,
    cuda_full_activations_budget,
    default_cuda_budget,
    out_of_memory_message,
    release,
    return_freed_tensors_to_os,
)
from tx.backends.torch.model import load_causal_lm, read_model_info, training_flops_per_token
from tx.backends.torch.optim import new_optimizer, optimizer_of, optimizer_step
from tx.backends.torch.packing import choose_packing
from tx.backends.torch.peft_compat import note_plain_peft
from tx.backends.torch.run import Run
from tx.backends.torch.settings import CPU_MICRO_BATCH_TOKENS
from tx.config.sections import TrainerSection
from tx.cpu import pass_threads
from tx.devices import resolve_device
from tx.models.agreement import token_tolerance
from tx.multimodal import AudioLimits, ImageLimits, audio_spec, vision_processor
from tx.multimodal.audio import check_frames_apart
from tx.optimizers import ADAMW, OptimizerConfig, OptimParams
from tx.types import (
    BaseLogprobs,
    BaseModelInfo,
    ConflictError,
    CustomLoss,
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

OPTIMIZER_FLOPS_PER_PARAM = 10  # about what AdamW's step spends on each trainable parameter (`_call_threads`)


class TorchBackend(TrainingBackend):
    def __init__(
        self,
        models: dict[str, Path],
        *,
        device: str = "auto",
        image_limits: ImageLimits | None = None,
        audio_limits: AudioLimits | None = None,
        settings: TrainerSection | None = None,
    ) -> None:
        """`models` maps each served base-model name to a local HF model directory; `image_limits` caps
        the images in training data (vision-language models); `settings` the micro-batch budget, dtype
        and checkpointing (defaults chosen for the device)."""
        self._paths = {name: Path(path) for name, path in models.items()}
        self.device = resolve_device(device)
        settings = settings or TrainerSection()  # default checkpointing on cuda: of the passes too large without
        self._checkpoint_by_size = settings.gradient_checkpointing is None and self.device.type == "cuda"
        self.settings = settings.resolved(self.device.type)
        if self.device.type == "cpu":
            return_freed_tensors_to_os()  # activations live in host memory: keep the peak bounded
        self._budgets: dict[str, int] = {}
        self._image_limits = image_limits or ImageLimits()
        self._audio_limits = audio_limits or AudioLimits()
        self._infos: dict[str, BaseModelInfo] = {}
        self._hosts: dict[str, AdapterHost] = {}
        self._runs: dict[str, Run] = {}
        self._fusion: dict[str, bool] = {}  # base model -> its runs share passes (`fusion_check.py`)
        self._flops_per_token: dict[str, float] = {}  # base model -> `training_flops_per_token`
        self._thread_share: int | None = None  # the trainer's CPU threads (`use_threads`; None: torch's own)

    def training_device(self) -> str:
        return str(self.device)

    def use_threads(self, threads: int) -> None:
        # torch's intra-op pool size is per calling thread once it has run an op: set it here, on the training
        # thread, never from another
        self._thread_share = threads
        _set_threads(threads)

    def _pass_threads(self, base_model: str, calls: list[tuple[Run, Call]]) -> None:
        """Threads for the pass of `calls`: ~`training_flops_per_token` operations for each of their tokens."""
        if base_model not in self._flops_per_token:
            self._flops_per_token[base_model] = training_flops_per_token(self._hosts[base_model].model)
        tokens = sum(item.num_tokens for _, call in calls for item in call.items)
        self._call_threads(tokens * self._flops_per_token[base_model])

    def _call_threads(self, flops: float) -> None:
        """On CPU, a call too small to split runs on one thread, any other on the trainer's share
        (`tx.cpu.pass_threads`); on the training thread, as `use_threads`."""
        if self.device.type != "cpu":
            return
        if self._thread_share is None:
            self._thread_share = torch.get_num_threads()
        _set_threads(pass_threads(self._thread_share, flops))

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
        return DatumRules.of_model_dir(info, model_dir, self.settings.max_sequence_tokens, self._image_limits,
                                       self._audio_limits)

    def base_logprobs(self, base_model: str, sequences: Sequence[Sequence[int]]) -> BaseLogprobs:
        host = self._host(base_model)
        model = host.model
        rows = []
        with torch.inference_mode(), host.base_only():
            for tokens in sequences:
                ids = torch.tensor([list(tokens)], device=model.device)
                logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
                picked = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
                rows.append(picked.cpu().tolist())
        return BaseLogprobs(rows, token_tolerance(model.dtype))

    def _host(self, base_model: str) -> AdapterHost:
        if base_model not in self._hosts:
            dtype = self._torch_dtype()
            checkpointing = bool(self.settings.gradient_checkpointing)
            path = self._paths[base_model]
            model = load_causal_lm(path, self.device, dtype, checkpointing, self.settings.attn_implementation)
            check_frames_apart(model, path)
            packing = choose_packing(model, vision_processor(path) is not None, base_model)
            self._hosts[base_model] = AdapterHost(model, packing, choose_logit_cap(model, base_model))
            self._budgets[base_model] = self._budget(model, dtype, checkpointing)
            logger.info("%s: micro-batches of up to %d tokens", base_model, self._budgets[base_model])
            if self._checkpoint_by_size:
                self._hosts[base_model].checkpoint_above = cuda_full_activations_budget(model, self.device, dtype)
        return self._hosts[base_model]

    def _plan(self, base_model: str, items: list[PreparedDatum]) -> list[list[int]]:
        """The micro-batches of `items` (indices), for the base model's rows (packed or padded)."""
        return plan(self._hosts[base_model], items, self._budgets[base_model])

    def _torch_dtype(self) -> torch.dtype:
        """The base weights' dtype (the settings are resolved for the device)."""
        return getattr(torch, str(self.settings.dtype))

    def _budget(self, model: PreTrainedModel, dtype: torch.dtype, checkpointing: bool) -> int:
        if self.settings.micro_batch_tokens is not None:
            return self.settings.micro_batch_tokens
        if self.device.type == "cuda":
            return default_cuda_budget(model, self.device, dtype, checkpointing)
        return CPU_MICRO_BATCH_TOKENS

    # ---- runs ----

    def create_model(self, model_id: str, base_model: str, lora: LoraConfig,
                     optimizer: OptimizerConfig = ADAMW) -> None:
        if model_id in self._runs:
            raise ConflictError(f"model {model_id!r} already exists")
        lora.validate()
        self.check_optimizer(optimizer)
        self.base_model_info(base_model)
        adapter = f"run_{uuid.uuid4().hex}"
        params = self._host(base_model).add(adapter, lora)
        run_optimizer = new_optimizer(params.values(), optimizer)
        self._runs[model_id] = Run(model_id, base_model, lora, adapter, params, run_optimizer)
        logger.info("created %s on %s (rank %d, %s)", model_id, base_model, lora.rank, optimizer.kind)

    def check_optimizer(self, optimizer: OptimizerConfig) -> None:
        optimizer.check()  # AdamW and Dimuon both run here

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
        run = self._run(model_id)
        return self._train(run.base_model, [(run, self._call(run, batch))])[0]

    def forward_backward_many(
        self, calls: Sequence[tuple[str, ForwardBackwardInput]]
    ) -> list[ForwardBackwardResult | Exception]:
        """Runs on one base model share one pass (`fused.py`) where the model allows it (`fusion_check.py`).
        A call refused by its own checks fails alone; a shared pass that fails (out of memory, a custom loss's
        error) is run again in turns, so each call gets its own result or error."""
        results: list[ForwardBackwardResult | Exception | None] = [None] * len(calls)
        ready: dict[tuple[str, bool], list[tuple[int, Run, Call]]] = {}
        for index, (model_id, batch) in enumerate(calls):
            try:
                run = self._run(model_id)
                key = (run.base_model, batch.forward_only)
                ready.setdefault(key, []).append((index, run, self._call(run, batch)))
            except (UserError, NotFoundError) as exc:
                results[index] = exc
        for (base_model, _), group in ready.items():
            shared = len(group) > 1 and self._fuses(base_model)
            for passes in [group] if shared else [[one] for one in group]:
                for (index, _, _), result in zip(passes, self._pass(base_model, passes), strict=True):
                    results[index] = result
        return [result for result in results if result is not None]

    def _pass(self, base_model: str, group: list[tuple[int, Run, Call]]) -> list[ForwardBackwardResult | Exception]:
        try:
            return list(self._train(base_model, [(run, call) for _, run, call in group]))
        except Exception as exc:  # noqa: BLE001 - each call's own outcome, below or in turns
            if len(group) == 1:
                return [exc]
            logger.warning("%s: a pass of %d runs failed (%s); running them in turns", base_model, len(group), exc)
        return [result for one in group for result in self._pass(base_model, [one])]

    def _fuses(self, base_model: str) -> bool:
        if base_model not in self._fusion:
            vision = vision_processor(self._paths[base_model])
            self._fusion[base_model] = fuses_exactly(self._hosts[base_model], self.device, vision, base_model)
        return self._fusion[base_model]

    def _call(self, run: Run, batch: ForwardBackwardInput) -> Call:
        """`batch` checked as the model sees it (UserError naming the datum), ready to run."""
        custom = compile_loss(batch.custom_loss) if batch.custom_loss is not None else None
        loss_fn, config = batch_loss(batch)
        info, vision = self.base_model_info(run.base_model), vision_processor(self._paths[run.base_model])
        items = prepare_data(
            batch.data, loss_fn, info, vision, self._image_limits, self.settings.max_sequence_tokens,
            audio_spec(self._paths[run.base_model]),
        )
        if batch.custom_loss is not None:
            check_custom_inputs(batch.custom_loss, batch.data)
        return Call(run.adapter, items, batch.data, loss_fn, config, custom, batch.forward_only)

    def _train(self, base_model: str, calls: list[tuple[Run, Call]]) -> list[ForwardBackwardResult]:
        """The calls' pass(es) on `base_model`. On any failure every run's gradients are left as they were
        (out of memory: TrainerOutOfMemory, the server goes on)."""
        start, names = time.perf_counter(), ", ".join(run.model_id for run, _ in calls)
        host, budget = self._hosts[base_model], self._budgets[base_model]
        self._pass_threads(base_model, calls)
        saved = [None if call.forward_only else _grads(run) for run, call in calls]
        message = None
        try:
            results = run_calls(host, [call for _, call in calls], budget, self.device,
                                vision_processor(self._paths[base_model]))
        except OUT_OF_MEMORY as exc:
            message = out_of_memory_message(exc, self.device, budget)
        except Exception:
            _restore_all(calls, saved)
            raise
        else:
            logger.debug("forward_backward %s: %d datums in %.3fs", names,
                         sum(len(call.items) for _, call in calls), time.perf_counter() - start)
            return results
        # outside the except block, so nothing refers to the failed step's frames any more
        _restore_all(calls, saved)
        release(self.device)
        logger.error("forward_backward %s: %s", names, message)
        raise TrainerOutOfMemory(message)

    def runs_custom_losses(self) -> bool:
        return True

    def check_custom_loss(self, loss: CustomLoss) -> None:
        compile_loss(loss)

    def optim_step(self, model_id: str, params: OptimParams) -> OptimStepResult:
        params.validate()
        run = self._run(model_id)
        self._call_threads(OPTIMIZER_FLOPS_PER_PARAM * sum(p.numel() for p in run.params.values()))
        return OptimStepResult(metrics=optimizer_step(run.optimizer, params))

    # ---- checkpoints ----

    def save_state(self, model_id: str, directory: Path) -> None:
        run = self._run(model_id)
        weights = {name: param.detach() for name, param in run.params.items()}
        checkpoint.write_state(directory, run.base_model, run.lora, weights, run.optimizer.state_dict(),
                               optimizer_of(run.optimizer))

    def load_state(self, model_id: str, directory: Path, *, with_optimizer: bool) -> None:
        """Load weights (and optimizer state) into `model_id`; its pending gradients are dropped.

        Without the optimizer, the run's optimizer starts afresh (moments from other weights would
        not mean anything); with it, the checkpoint's optimizer must be the run's.
        """
        run = self._run(model_id)
        base_model, lora = self.read_state_config(directory)
        check_compatible(run, base_model, lora, directory)
        kind = optimizer_of(run.optimizer)
        if with_optimizer and (saved := checkpoint.read_state_optimizer(directory)) != kind:
            raise UserError(f"checkpoint {directory} holds {saved.kind} state; this run trains with {kind.kind}")
        weights = checkpoint.read_weights(directory, self.device)
        optimizer_state = checkpoint.read_optimizer_state(directory, self.device) if with_optimizer else None
        _copy_weights(run, weights, directory)
        run.zero_grad()
        run.optimizer = new_optimizer(run.params.values(), kind)
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
        config = host.peft_config(run.adapter)
        checkpoint.write_sampler_weights(directory, run.base_model, config, weights)
        note_plain_peft(directory, self._paths[run.base_model], run.base_model, config, weights)

    def gradients(self, model_id: str) -> dict[str, torch.Tensor | None]:
        """The run's accumulated gradients by PEFT file name (None where nothing accumulated yet)."""
        return {name: param.grad for name, param in self._run(model_id).params.items()}

    def iter_trainable_weights(self, model_id: str) -> Iterator[tuple[str, Any]]:
        """The run's live LoRA tensors (detached, not copied), named as in its PEFT adapter file."""
        for name, param in self._run(model_id).params.items():
            yield name, param.detach()


def _grads(run: Run) -> dict[str, torch.Tensor | None]:
    """Copies of the run's accumulated gradients (LoRA-sized), to undo a step that fails half-way."""
    return {name: None if p.grad is None else p.grad.clone() for name, p in run.params.items()}


def _restore_grads(run: Run, saved: dict[str, torch.Tensor | None]) -> None:
    for name, param in run.params.items():
        param.grad = saved[name]


def _restore_all(calls: list[tuple[Run, Call]], saved: list[dict[str, torch.Tensor | None] | None]) -> None:
    for (run, _), grads in zip(calls, saved, strict=True):
        if grads is not None:
            _restore_grads(run, grads)


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


def _set_threads(threads: int) -> None:
    if threads != torch.get_num_threads():
        torch.set_num_threads(threads)
