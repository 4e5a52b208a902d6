"""Trainer workers as Ray actors (CPU): 2 actors placed in the launcher's placement group train like one process."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

ray = pytest.importorskip("ray")
if not hasattr(ray, "init"):  # tests/ is on sys.path, so tests/ray can pose as the package
    pytest.skip("ray is not installed (pip install 'tx[ray]')", allow_module_level=True)

from tx.backends.torch.backend import TorchBackend
from tx.backends.torch.workers import create_workers_backend
from tx.inference.launch.ray_launcher import RayLauncher
from tx.models.tiny import write_tiny_text_model
from tx.optimizers import AdamParams
from tx.ray import connect
from tx.ray.placement import PlacementSpec
from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput

pytestmark = pytest.mark.ray
LORA = LoraConfig(rank=4, seed=5)


def batch(seed: int) -> ForwardBackwardInput:
    rng = np.random.default_rng(seed)
    data = []
    for length in (17, 9, 13):
        seq = rng.integers(0, 500, size=length)
        data.append(
            Datum(
                ModelInput.from_tokens(seq[:-1].tolist()),
                {"target_tokens": seq[1:].astype(np.int64), "weights": np.ones(length - 1, np.float32)},
            )
        )
    return ForwardBackwardInput(data, "cross_entropy")


def losses(backend, model_id: str) -> list[float]:
    out = []
    for step in range(2):
        out.append(backend.forward_backward(model_id, batch(step)).metrics["loss:sum"])
        backend.optim_step(model_id, AdamParams(learning_rate=5e-3))
    return out


def test_two_ray_actor_workers_train_like_one_process(tmp_path):
    os.environ["RAY_AUTH_MODE"] = "disabled"
    if ray.is_initialized():
        ray.shutdown()
    connect(num_cpus=2, object_store_memory=200 * 1024**2)
    spec = PlacementSpec(num_engines=1, num_trainer_workers=2, use_gpu=False, cpus_per_bundle=0.5)
    launcher = RayLauncher(spec, "unused-secret")
    models = {"tiny": write_tiny_text_model(tmp_path / "tiny")}
    workers = create_workers_backend(
        models,
        2,
        device="cpu",
        threads=1,
        ray_options=lambda rank: asyncio.run(launcher.trainer_options(rank)),
    )
    try:
        workers.create_model("two", "tiny", LORA)
        free = (
            ray.available_resources()
        )  # each trainer actor holds its own bundle's CPUs; the engine's is free
        group = launcher.group.id.hex()
        assert [free.get(f"CPU_group_{bundle}_{group}", 0) for bundle in range(3)] == [0, 0, 0.5]
        one = TorchBackend(models, device="cpu")
        one.create_model("one", "tiny", LORA)
        np.testing.assert_allclose(losses(workers, "two"), losses(one, "one"), rtol=1e-6, atol=1e-5)
        workers.save_state("two", tmp_path / "state")
        one.load_state("one", tmp_path / "state", with_optimizer=True)
    finally:
        workers.close()
        asyncio.run(launcher.close())
        ray.shutdown()
