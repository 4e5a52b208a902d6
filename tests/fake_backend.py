"""FakeBackend: a stand-in trainer for in-process tests of `tx/core` (no torch, no model files).

It implements the whole `TrainingBackend` ABC, so a method the core starts calling without the ABC
declaring it, or an ABC method the fake lacks, fails the tests. Each run's "model" is one number `w`;
the loss of a batch is `w * tokens` and an optim step moves `w` by the learning rate, so tests can
check order and effect. Every call is recorded in `calls`. Datums are checked at submission by the
ABC's own `check_batch` (the real rules, against `INFO`); `failures` makes the next forward_backward calls
fail as they run, for errors only the trainer finds.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tx.backends.base import TrainingBackend
from tx.optimizers import ADAMW, OptimizerConfig, OptimParams
from tx.types import (
    BaseModelInfo,
    ConflictError,
    ForwardBackwardInput,
    ForwardBackwardResult,
    LoraConfig,
    NotFoundError,
    OptimStepResult,
)

BASE = "fake-base"
INFO = BaseModelInfo(name=BASE, arch="FakeForCausalLM", tokenizer_id="fake/tokenizer", vocab_size=100,
                     max_context_length=64)


class FakeBackend(TrainingBackend):
    def __init__(self) -> None:
        self.weights: dict[str, float] = {}
        self.bases: dict[str, tuple[str, LoraConfig]] = {}
        self.calls: list[tuple[str, str]] = []
        self.batches: list[ForwardBackwardInput] = []  # every batch forward_backward ran, as it got it
        self.release = threading.Event()  # cleared: forward_backward blocks until set
        self.release.set()
        self.failures: list[Exception] = []  # raised, in order, by the next forward_backward calls
        self.closed = False

    def training_device(self) -> str:
        return "cpu"

    def close(self) -> None:
        self.closed = True

    def base_model_info(self, base_model: str) -> BaseModelInfo:
        if base_model != BASE:
            raise NotFoundError(f"base model {base_model!r} is not served")
        return INFO

    def served_models(self) -> list[BaseModelInfo]:
        return [INFO]

    def create_model(self, model_id: str, base_model: str, lora: LoraConfig,
                     optimizer: OptimizerConfig = ADAMW) -> None:
        self.base_model_info(base_model)
        if model_id in self.weights:
            raise ConflictError(f"model {model_id!r} already exists")
        self.weights[model_id], self.bases[model_id] = 0.0, (base_model, lora)
        self.calls.append(("create_model", model_id))

    def has_model(self, model_id: str) -> bool:
        return model_id in self.weights

    def delete_model(self, model_id: str) -> None:
        self._require(model_id)
        del self.weights[model_id], self.bases[model_id]
        self.calls.append(("delete_model", model_id))

    def forward_backward(self, model_id: str, batch: ForwardBackwardInput) -> ForwardBackwardResult:
        self._require(model_id)
        self.release.wait(30)
        if self.failures:
            raise self.failures.pop(0)
        tokens = sum(len(d.model_input.text_tokens()) for d in batch.data)
        self.calls.append(("forward" if batch.forward_only else "forward_backward", model_id))
        self.batches.append(batch)
        outputs = [{"logprobs": np.zeros(len(d.model_input.text_tokens()), np.float32)} for d in batch.data]
        return ForwardBackwardResult(outputs, {"loss:sum": self.weights[model_id] * tokens})

    def optim_step(self, model_id: str, adam: OptimParams) -> OptimStepResult:
        self._require(model_id)
        self.weights[model_id] += adam.learning_rate
        self.calls.append(("optim_step", model_id))
        return OptimStepResult({"learning_rate:mean": adam.learning_rate})

    def save_state(self, model_id: str, directory: Path) -> None:
        base, lora = self.bases[self._require(model_id)]
        state = {"w": self.weights[model_id], "base": base, "rank": lora.rank}
        (directory / "state.json").write_text(json.dumps(state))
        self.calls.append(("save_state", model_id))

    def load_state(self, model_id: str, directory: Path, *, with_optimizer: bool) -> None:
        self.weights[self._require(model_id)] = json.loads((directory / "state.json").read_text())["w"]
        self.calls.append(("load_state", model_id))

    def read_state_config(self, directory: Path) -> tuple[str, LoraConfig]:
        state = json.loads((directory / "state.json").read_text())
        return state["base"], LoraConfig(rank=state["rank"])

    def read_state_optimizer(self, directory: Path) -> OptimizerConfig:
        return ADAMW  # its runs keep no optimizer state

    def save_sampler_weights(self, model_id: str, directory: Path) -> None:
        (directory / "sampler.json").write_text(json.dumps({"w": self.weights[self._require(model_id)]}))

    def iter_trainable_weights(self, model_id: str) -> Iterator[tuple[str, Any]]:
        yield "w", np.array([self.weights[self._require(model_id)]], np.float32)

    def _require(self, model_id: str) -> str:
        if model_id not in self.weights:
            raise NotFoundError(f"model {model_id!r} does not exist")
        return model_id
