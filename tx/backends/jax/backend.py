"""`JaxBackend`: dense Qwen3 / Llama 3 models in JAX with LoRA runs, trained with AdamW through optax.

One base model is loaded per served name (on the first run created on it), placed on the device mesh and
shared by every run on it; each run holds its own adapter, accumulated gradients and AdamW state, so runs
never touch each other. A request is validated as the torch backend validates it, cut into bucketed
micro-batches (`shapes.py`) and run through the jitted passes of `step.py`. The core calls these methods
from one thread, one at a time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from tx.backends.base import adam_params
from tx.backends.jax import lora as lora_mod
from tx.backends.jax import mesh as mesh_mod
from tx.backends.jax import optim, shapes, state, step
from tx.backends.jax.model import load_weights
from tx.backends.jax.spec import ModelSpec, read_spec
from tx.backends.lora_files import LoraFilesBackend, check_compatible
from tx.backends.losses import get_loss
from tx.backends.torch import checkpoint
from tx.backends.torch.model import read_model_info
from tx.backends.torch.settings import CPU_MICRO_BATCH_TOKENS
from tx.models.agreement import FLOAT32_TOLERANCE
from tx.optimizers import ADAMW, OptimizerConfig, OptimParams
from tx.types import (
    BaseLogprobs,
    BaseModelInfo,
    ConflictError,
    ForwardBackwardInput,
    ForwardBackwardResult,
    LoraConfig,
    NotFoundError,
    OptimStepResult,
)

logger = logging.getLogger(__name__)


@dataclass
class Host:
    """A base model on the mesh."""

    spec: ModelSpec
    info: BaseModelInfo
    base: dict[str, jax.Array]


@dataclass
class Run:
    model_id: str
    base_model: str
    lora: LoraConfig
    adapter: Any  # {module path: (A, B)} of replicated jax arrays
    grads: Any  # same structure; accumulated since the last optim_step
    opt_state: Any
    has_grads: bool = False

    @property
    def scale(self) -> np.float32:
        return np.float32(lora_mod.scale(self.lora))


class JaxBackend(LoraFilesBackend):
    def __init__(self, models: dict[str, Path], *, device: str = "auto",
                 micro_batch_tokens: int | None = None,
                 num_devices: int | None = None) -> None:
        """`models` maps each served name to a local HF model directory. Every model is checked now, so
        one this backend cannot train (a vision-language model, say) stops the server at startup.
        `micro_batch_tokens` bounds the padded tokens of one compiled pass (--train-micro-batch-tokens; the
        torch trainer's CPU default when None); `num_devices` limits the mesh to the first N local devices
        (all by default)."""
        if device not in ("auto", "cpu"):
            raise ValueError(f"--backend jax trains on JAX's devices: use --device auto or cpu, not "
                             f"{device!r} (choose accelerators with JAX_PLATFORMS)")
        self._paths = {name: Path(path) for name, path in models.items()}
        self._specs = {name: read_spec(path) for name, path in self._paths.items()}
        self._infos = {name: read_model_info(name, path) for name, path in self._paths.items()}
        self.mesh: Mesh = mesh_mod.local_mesh("cpu" if device == "cpu" else None, num_devices)
        self.micro_batch_tokens = micro_batch_tokens or CPU_MICRO_BATCH_TOKENS
        self._hosts: dict[str, Host] = {}
        self._runs: dict[str, Run] = {}
        platform = self.mesh.devices.flat[0].platform
        logger.info("jax backend on %d %s device(s)", self.mesh.devices.size, platform)

    # ---- base models ----

    def base_model_info(self, base_model: str) -> BaseModelInfo:
        if base_model not in self._infos:
            served = sorted(self._paths)
            raise NotFoundError(f"base model {base_model!r} is not served here (served: {served})")
        return self._infos[base_model]

    def served_models(self) -> list[BaseModelInfo]:
        return list(self._infos.values())

    def base_logprobs(self, base_model: str, sequences: Sequence[Sequence[int]]) -> BaseLogprobs:
        """The base model's forward of each sequence, no adapter (one compilation per length); float32 weights,
        so the float32 bound."""
        self.base_model_info(base_model)
        host = self._host(base_model)
        rows = []
        for tokens in sequences:
            ids = self._replicate(np.asarray([list(tokens)], dtype=np.int32))
            rows.append(np.asarray(step.base_logprobs(host.base, ids, spec=host.spec))[0].tolist())
        return BaseLogprobs(rows, FLOAT32_TOLERANCE)

    def _host(self, base_model: str) -> Host:
        if base_model not in self._hosts:
            spec = self._specs[base_model]
            weights = load_weights(self._paths[base_model], spec)
            base = mesh_mod.place_base(self.mesh, weights)
            self._hosts[base_model] = Host(spec, self._infos[base_model], base)
        return self._hosts[base_model]

    # ---- runs ----

    def create_model(self, model_id: str, base_model: str, lora: LoraConfig,
                     optimizer: OptimizerConfig = ADAMW) -> None:
        if model_id in self._runs:
            raise ConflictError(f"model {model_id!r} already exists")
        lora.validate()
        self.check_optimizer(optimizer)
        self.base_model_info(base_model)
        host = self._host(base_model)
        adapter = self._replicate(lora_mod.init_adapter(host.spec, lora))
        opt_state = optim.new_state(adapter)
        self._runs[model_id] = Run(model_id, base_model, lora, adapter, _zeros(adapter), opt_state)
        logger.info("created %s on %s (rank %d)", model_id, base_model, lora.rank)

    def trainer_name(self) -> str:
        return "the JAX trainer (--backend jax)"

    def has_model(self, model_id: str) -> bool:
        return model_id in self._runs

    def delete_model(self, model_id: str) -> None:
        self._run(model_id)
        del self._runs[model_id]

    def _run(self, model_id: str) -> Run:
        if model_id not in self._runs:
            raise NotFoundError(f"model {model_id!r} is not loaded")
        return self._runs[model_id]

    def _replicate(self, tree: Any) -> Any:
        return jax.device_put(tree, mesh_mod.replicated(self.mesh))

    # ---- training ----

    def forward_backward(self, model_id: str, batch: ForwardBackwardInput) -> ForwardBackwardResult:
        start = time.perf_counter()
        run = self._run(model_id)
        loss_fn = get_loss(batch.loss_fn)
        resolved = loss_fn.resolve_config(batch.loss_fn_config)
        config = {key: np.float32(value) for key, value in resolved.items()}
        host = self._host(run.base_model)
        checked = shapes.validate(batch.data, loss_fn, host.info)
        lengths = [len(tokens) for tokens, _ in checked]
        plan = shapes.plan(lengths, self.micro_batch_tokens, host.info.max_context_length,
                           self.mesh.devices.size)
        outputs: dict[int, np.ndarray] = {}
        total = 0.0
        for indices, length, rows in plan:
            micro = shapes.pack(checked, indices, length, rows)
            arrays = self._place(micro)
            static = {"spec": host.spec, "loss_name": loss_fn.name}
            if batch.forward_only:
                loss, logp = step.forward(host.base, run.adapter, arrays, run.scale, config, **static)
            else:
                loss, logp, run.grads = step.forward_backward(
                    host.base, run.adapter, run.grads, arrays, run.scale, config, **static
                )
                run.has_grads = True
            total += float(loss)
            outputs.update(shapes.unpack(np.asarray(logp), micro, checked))
        logger.debug("forward_backward %s: %d datums, %d micro-batches in %.3fs",
                     model_id, len(checked), len(plan), time.perf_counter() - start)
        return ForwardBackwardResult(
            loss_fn_outputs=[{"logprobs": outputs[i]} for i in range(len(checked))],
            metrics={"loss:sum": total},
        )

    def _place(self, micro: shapes.MicroBatch) -> dict[str, Any]:
        arrays = {"input_ids": micro.input_ids, "targets": micro.targets, "mask": micro.mask,
                  "inputs": micro.inputs}
        return jax.device_put(arrays, mesh_mod.rows(self.mesh))

    def optim_step(self, model_id: str, params: OptimParams) -> OptimStepResult:
        """AdamW on the accumulated gradients, then zero them. Without any since the last step, nothing moves
        (as torch skips parameters without gradients)."""
        adam = adam_params(params)
        adam.validate()
        run = self._run(model_id)
        if not run.has_grads:
            return OptimStepResult(metrics={"grad_norm": 0.0, "learning_rate": adam.learning_rate})
        run.adapter, run.opt_state, metrics = optim.adam_step(run.adapter, run.grads, run.opt_state, adam)
        run.grads, run.has_grads = _zeros(run.adapter), False
        return OptimStepResult(metrics=metrics)

    def gradients(self, model_id: str) -> dict[str, Any]:
        """The run's accumulated gradients by PEFT file name, as torch tensors (for tests)."""
        return {name: state.to_torch(g) for name, g in lora_mod.to_peft(self._run(model_id).grads).items()}

    # ---- checkpoints ----

    def save_state(self, model_id: str, directory: Path) -> None:
        run = self._run(model_id)
        weights = dict(self.iter_trainable_weights(model_id))
        mu, nu, count = optim.moments(run.opt_state)
        mu, nu = lora_mod.to_peft(mu), lora_mod.to_peft(nu)
        optimizer_state = state.torch_optimizer_state(weights, mu, nu, count)
        checkpoint.write_state(directory, run.base_model, run.lora, weights, optimizer_state)

    def load_state(self, model_id: str, directory: Path, *, with_optimizer: bool) -> None:
        """Load weights (and AdamW state) into `model_id`; pending gradients are dropped and, without the
        optimizer, AdamW starts afresh."""
        run = self._run(model_id)
        base_model, lora = self.read_state_config(directory)
        check_compatible(run, base_model, lora, directory)
        modules = lora_mod.module_shapes(self._specs[run.base_model], run.lora)
        loaded = state.read(directory, state.peft_shapes(modules, run.lora.rank), with_optimizer)
        paths = list(modules)
        run.adapter = self._replicate(lora_mod.from_peft(loaded.weights, paths))
        run.grads, run.has_grads = _zeros(run.adapter), False
        run.opt_state = optim.new_state(run.adapter)
        if loaded.moments is not None:
            mu, nu, count = loaded.moments
            mu, nu = (self._replicate(lora_mod.from_peft(m, paths)) for m in (mu, nu))
            run.opt_state = optim.with_moments(run.opt_state, mu, nu, count)

    def iter_trainable_weights(self, model_id: str) -> Iterator[tuple[str, Any]]:
        """The run's LoRA tensors as CPU torch tensors (zero-copy views of the JAX buffers on a CPU), named
        as in its PEFT adapter file. JAX arrays are immutable: a later step makes new ones, never changes
        these."""
        for name, array in lora_mod.to_peft(self._run(model_id).adapter).items():
            yield name, state.to_torch(array)


def _zeros(tree: Any) -> Any:
    return jax.tree.map(jax.numpy.zeros_like, tree)
