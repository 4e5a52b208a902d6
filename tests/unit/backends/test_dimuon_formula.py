"""Dimuon (tx/backends/torch/dimuon.py): the polar factor against an SVD, one step against the documented formula
computed here independently, its state in save_state, and the optimizer fixed per run."""

from __future__ import annotations

import pytest
import torch
from backend_helpers import TINY_NAME, ce, grads, randomize, sft_data, snapshot

from tx.backends.torch import checkpoint
from tx.backends.torch.dimuon import orthogonalize
from tx.optimizers import DIMUON, AdamParams, DimuonParams
from tx.types import LoraConfig, UserError

LORA = LoraConfig(rank=4, seed=0, train_mlp=False)
DATA = sft_data(seed=1, count=2, length=17)


def polar(matrix: torch.Tensor) -> torch.Tensor:
    u, _, vh = torch.linalg.svd(matrix.double(), full_matrices=False)
    return (u @ vh).float()


def test_the_direction_is_the_polar_factor() -> None:
    gen = torch.Generator().manual_seed(0)
    shapes = [(4, 64), (64, 4), (8, 8), (16, 1024), (2, 3)]
    matrices = [torch.randn(shape, generator=gen) for shape in shapes] + [torch.zeros(4, 32)]
    for matrix, direction in zip(matrices, orthogonalize(matrices), strict=True):
        assert direction.shape == matrix.shape
        expected = polar(matrix) if matrix.any() else torch.zeros_like(matrix)
        torch.testing.assert_close(direction, expected, atol=2e-3, rtol=0)
        if matrix.any():  # a full-rank r-sided matrix: Frobenius norm sqrt(r)
            assert abs(float(direction.norm()) - min(matrix.shape) ** 0.5) < 2e-3


def test_one_step_is_the_documented_formula(backend) -> None:
    backend.create_model("d", TINY_NAME, LORA, DIMUON)
    randomize(backend, "d", seed=3)
    before = snapshot(backend, "d")
    momentum = {}
    for step, params in enumerate([DimuonParams(learning_rate=0.01, beta1=0.8),
                                   DimuonParams(learning_rate=0.02, beta1=0.5, grad_clip_norm=0.1)]):
        backend.forward_backward("d", ce(DATA))
        g = grads(backend, "d")
        total = float(torch.linalg.vector_norm(torch.stack([t.norm() for t in g.values() if t is not None])))
        scale = min(1.0, params.grad_clip_norm / (total + 1e-6)) if params.grad_clip_norm > 0 else 1.0
        metrics = backend.optim_step("d", params).metrics
        assert metrics["grad_norm"] == pytest.approx(total, rel=1e-5)
        for name, weight in before.items():
            grad = g[name] * scale
            momentum[name] = params.beta1 * momentum.get(name, torch.zeros_like(grad)) + (1 - params.beta1) * grad
            before[name] = weight - params.learning_rate * polar(momentum[name])
        after = snapshot(backend, "d")
        for name in before:
            torch.testing.assert_close(after[name], before[name], atol=5e-5, rtol=0, msg=f"step {step}: {name}")


def test_dimuon_state_is_saved_and_the_optimizer_is_the_runs(backend, tmp_path) -> None:
    backend.create_model("d", TINY_NAME, LORA, DIMUON)
    for _ in range(2):
        backend.forward_backward("d", ce(DATA))
        backend.optim_step("d", DimuonParams(learning_rate=0.01))
    backend.save_state("d", tmp_path / "state")
    assert checkpoint.read_state_optimizer(tmp_path / "state") == DIMUON
    saved = checkpoint.read_optimizer_state(tmp_path / "state", torch.device("cpu"))
    assert {key for entry in saved["state"].values() for key in entry} == {"momentum", "step"}
    with pytest.raises(UserError, match="optim_step takes DimuonParams"):
        backend.optim_step("d", AdamParams())
    backend.create_model("a", TINY_NAME, LORA)
    with pytest.raises(UserError, match="holds dimuon state"):
        backend.load_state("a", tmp_path / "state", with_optimizer=True)
    backend.load_state("a", tmp_path / "state", with_optimizer=False)  # weights only: fine
