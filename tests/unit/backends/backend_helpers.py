"""Datums, batches and weight snapshots for the torch backend tests."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import torch

from tx.core.engine_check import TrainerReference
from tx.core.futures import FutureRegistry
from tx.core.scheduler import Scheduler
from tx.optimizers import AdamParams
from tx.types import BaseLogprobs, Datum, ForwardBackwardInput, ModelInput

TINY_NAME = "tiny-qwen3"
TINY_VOCAB = 512
TINY_MAX_LEN = 256


def datum(tokens, **inputs) -> Datum:
    """A text datum; float inputs become float32, `target_tokens` int64."""
    arrays = {
        key: np.asarray(value, dtype=np.int64 if key == "target_tokens" else np.float32)
        for key, value in inputs.items()
    }
    return Datum(ModelInput.from_tokens(list(tokens)), arrays)


def sequences(seed: int, count: int, length: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, TINY_VOCAB, size=(count, length))


def sft_data(seed: int = 0, count: int = 4, length: int = 33, weights=None) -> list[Datum]:
    """Next-token datums from random sequences: input seq[:-1], targets seq[1:]."""
    data = []
    for i, seq in enumerate(sequences(seed, count, length)):
        w = np.ones(length - 1) if weights is None else weights[i]
        data.append(datum(seq[:-1], target_tokens=seq[1:], weights=w))
    return data


def ce(data: list[Datum], forward_only: bool = False) -> ForwardBackwardInput:
    return ForwardBackwardInput(data=data, loss_fn="cross_entropy", forward_only=forward_only)


def snapshot(backend, model_id: str) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in backend.iter_trainable_weights(model_id)}


def grads(backend, model_id: str) -> dict[str, torch.Tensor | None]:
    return {n: None if g is None else g.clone() for n, g in backend.gradients(model_id).items()}


def randomize(backend, model_id: str, seed: int, scale: float = 0.05) -> None:
    """Give every LoRA tensor random values (a fresh adapter's B is zero, hiding A's gradients)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, tensor in backend.iter_trainable_weights(model_id):
            tensor.copy_(torch.randn(tensor.shape, generator=gen) * scale)


def peft_pass(backend, batch: ForwardBackwardInput, lora) -> tuple[Any, dict[str, torch.Tensor | None], set[int]]:
    """One fresh run's forward_backward on randomized LoRA weights: its result, its gradients, and the ids of the
    LoRA Linear modules whose own (PEFT's) forward ran, to tell where tx's lean paths were taken."""
    from peft.tuners.lora.layer import Linear as LoraLinear

    backend.create_model("m", TINY_NAME, lora)
    randomize(backend, "m", seed=3)  # B nonzero: every LoRA layer counts
    called: set[int] = set()
    original = LoraLinear.forward

    def spy(self, x, *args, **kwargs):
        called.add(id(self))
        return original(self, x, *args, **kwargs)

    LoraLinear.forward = spy
    try:
        result = backend.forward_backward("m", batch)
    finally:
        LoraLinear.forward = original
    out = result, grads(backend, "m"), called
    backend.delete_model("m")
    return out


def make_unplain(model, layer, case: str, target: str) -> None:
    """Make `layer` (a PEFT LoRA Linear on `target` of `model`) other than plain LoRA, in the way `case` names:
    "two adapters" active, "hooked", "merged" or "disabled" (dropout and DoRA are set in the config instead)."""
    import peft

    if case == "two adapters":
        model.add_adapter("other", peft.LoraConfig(r=2, target_modules=[target]))
        model.base_model.set_adapter(["default", "other"])
    elif case == "hooked":
        layer.register_forward_hook(lambda *_: None)
    elif case == "merged":
        layer.merge()
    elif case == "disabled":
        layer.enable_adapters(False)


def train(backend, model_id: str, data: list[Datum], steps: int, lr: float = 5e-3) -> list[float]:
    """`steps` forward_backward + optim_step rounds; the loss of each round."""
    losses = []
    for _ in range(steps):
        losses.append(backend.forward_backward(model_id, ce(data)).metrics["loss:sum"])
        backend.optim_step(model_id, AdamParams(learning_rate=lr))
    return losses


def core_reference(backend, base_model: str, sequences: list[list[int]]) -> BaseLogprobs | None:
    """What the core hands the engines' self-check for `backend` (`tx/core/engine_check.py`, on its training
    thread); None is what leaves an engine unchecked, with a warning."""

    async def ask() -> BaseLogprobs | None:
        futures = FutureRegistry(asyncio.get_running_loop(), ttl_s=3600)
        scheduler = Scheduler(futures, 30)
        scheduler.start()
        try:
            return await TrainerReference(backend, futures, scheduler)(base_model, sequences)
        finally:
            scheduler.stop(5)

    return asyncio.run(ask())
