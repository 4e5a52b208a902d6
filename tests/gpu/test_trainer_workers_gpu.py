"""Trainer workers on GPUs: 2 workers (NCCL, one GPU each; base held whole or sharded with FSDP2) train like the
trainer on 1 GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tx.backends.torch.backend import TorchBackend
from tx.backends.torch.workers import create_workers_backend
from tx.config.sections import TrainerSection
from tx.models.tiny import write_tiny_text_model
from tx.optimizers import AdamParams
from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"),
]
LORA = LoraConfig(rank=8, seed=2)


def batch(seed: int) -> ForwardBackwardInput:
    rng = np.random.default_rng(seed)
    data = []
    for length in (65, 33, 49, 17):
        seq = rng.integers(0, 500, size=length)
        inputs = {"target_tokens": seq[1:].astype(np.int64), "weights": np.ones(length - 1, np.float32)}
        data.append(Datum(ModelInput.from_tokens(seq[:-1].tolist()), inputs))
    return ForwardBackwardInput(data, "cross_entropy")


def train(backend, model_id: str) -> tuple[list[float], dict[str, torch.Tensor]]:
    losses = []
    for step in range(3):
        losses.append(backend.forward_backward(model_id, batch(step)).metrics["loss:sum"])
        backend.optim_step(model_id, AdamParams(learning_rate=5e-3, grad_clip_norm=1.0))
    return losses, {name: t.detach().cpu().clone() for name, t in backend.iter_trainable_weights(model_id)}


@pytest.mark.parametrize("shard_base", ["never", "always"])
def test_two_gpus_give_the_one_gpu_result(tmp_path, shard_base):
    models = {"tiny": write_tiny_text_model(tmp_path / "tiny", preset="bench")}
    one = TorchBackend(models, device="cuda:0")
    one.create_model("one", "tiny", LORA)
    expected_losses, expected_weights = train(one, "one")
    del one
    torch.cuda.empty_cache()

    workers = create_workers_backend(models, 2, device="cuda", trainer=TrainerSection(shard_base=shard_base))
    try:
        workers.create_model("two", "tiny", LORA)
        losses, weights = train(workers, "two")
    finally:
        workers.close()
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-4)
    for name, tensor in expected_weights.items():
        torch.testing.assert_close(weights[name], tensor, atol=1e-4, rtol=1e-3, msg=name)
