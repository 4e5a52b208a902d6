"""Dimuon (version 1): tx's orthogonalised-momentum optimizer for a run's LoRA matrices (docs/optimizers.md#dimuon).

Hosted Tinker does not publish its Dimuon, so this is tx's own formula. For every LoRA matrix W (lora_A is
r x d_in, lora_B is d_out x r) with accumulated gradient G, one `optim_step` with `DimuonParams` does:

1. clip: with `grad_clip_norm` > 0, if the global norm of all the run's LoRA gradients exceeds it, every G is
   scaled by grad_clip_norm / norm (as for AdamW; `grad_norm` is reported before clipping);
2. momentum: M <- beta1 * M + (1 - beta1) * G, with M = 0 before the first step (float32);
3. direction: O = the orthogonal polar factor of M (U V^T for M = U S V^T), by Newton-Schulz iteration on the
   small side: X = M / (||M||_F + 1e-7) (oriented so that X X^T is r x r; the steps run on r x r matrices in
   float64, see `_polar`), then 5 quintic steps
   X <- a X + (b A + c A^2) X with A = X X^T and (a, b, c) = (3.4445, -4.7750, 2.0315), which lift small
   singular values fast, then 3 cubic steps X <- 1.5 X - 0.5 A X, which bring every singular value that the
   quintic steps lifted to 1 within 1e-3. Directions of M below ~1e-4 of its Frobenius norm stay small: noise
   is not amplified, and a zero M (lora_A before lora_B has moved) gives a zero step;
4. update: W <- W - learning_rate * O. A full-rank LoRA matrix's direction has Frobenius norm sqrt(r): the
   learning rate is the step along each singular direction, alike for every LoRA matrix whatever its shape
   and rank (no further scaling).

Matrices of one shape go through the iteration together (batched matmuls). The state is M per matrix and
the step count, float32, saved in the checkpoint (`optimizer.pt`, the torch optimizer state dict), so a run
resumed with its optimizer continues exactly as an uninterrupted one.
"""

from __future__ import annotations

from collections import defaultdict

import torch

QUINTIC = (3.4445, -4.7750, 2.0315)
QUINTIC_STEPS, CUBIC_STEPS = 5, 3
NORM_EPS = 1e-7
# the multi-tensor kernels torch.optim's own optimizers use; torch's stubs do not re-export them
_foreach_mul_ = torch._foreach_mul_  # pyright: ignore[reportPrivateImportUsage]
_foreach_add_ = torch._foreach_add_  # pyright: ignore[reportPrivateImportUsage]


class Dimuon(torch.optim.Optimizer):
    """Dimuon over `params`; `lr` and `beta1` are set by each step (`tx.backends.torch.optim.optimizer_step`)."""

    def __init__(self, params) -> None:
        super().__init__(list(params), {"lr": 0.0, "beta1": 0.9})

    @torch.no_grad()
    def step(self, closure=None) -> None:  # noqa: ARG002 - torch's signature; tx never passes a closure
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            states = [self._state(p) for p in params]
            momenta = [state["momentum"] for state in states]
            _foreach_mul_(momenta, group["beta1"])
            _foreach_add_(momenta, [p.grad.float() for p in params if p.grad is not None],
                          alpha=1 - group["beta1"])
            _foreach_add_([state["step"] for state in states], 1)
            directions = [d.to(p.dtype) for p, d in zip(params, orthogonalize(momenta), strict=True)]
            _foreach_add_(params, directions, alpha=-group["lr"])

    def _state(self, param: torch.Tensor) -> dict:
        state = self.state[param]
        if not state:
            state["momentum"] = torch.zeros_like(param, dtype=torch.float32)
            state["step"] = torch.zeros((), dtype=torch.float32)
        return state


def orthogonalize(matrices: list[torch.Tensor]) -> list[torch.Tensor]:
    """The polar factor of each matrix (a vector counts as one row), as described above; shapes kept."""
    out: list[torch.Tensor | None] = [None] * len(matrices)
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    flat = [m.reshape(m.shape[0], -1) if m.dim() > 1 else m.reshape(1, -1) for m in matrices]
    for index, matrix in enumerate(flat):
        groups[(matrix.shape[0], matrix.shape[1])].append(index)
    for (rows, cols), indices in groups.items():
        stacked = torch.stack([flat[i].float() for i in indices])
        polar = _polar(stacked.mT if rows > cols else stacked)
        polar = polar.mT if rows > cols else polar
        for slot, index in enumerate(indices):
            out[index] = polar[slot].reshape(matrices[index].shape)
    return [o for o in out if o is not None]


def _polar(x: torch.Tensor) -> torch.Tensor:
    """Newton-Schulz on a batch of wide matrices (rows r <= cols n), run on the r x r side: every iterate is
    X_k = Q_k X_0 for an r x r Q_k, and X_k X_k^T = Q_k S Q_k^T with S = X_0 X_0^T, so the steps touch only r x r
    matrices (float64) and the n-long side is read twice (S, then Q X_0) instead of three times a step."""
    x = x / (torch.linalg.matrix_norm(x, keepdim=True) + NORM_EPS)
    gram = (x @ x.mT).double()
    eye = torch.eye(x.shape[-2], dtype=torch.float64, device=x.device).expand_as(gram)
    q = eye.clone()
    a, b, c = QUINTIC
    for _ in range(QUINTIC_STEPS):
        inner = q @ gram @ q.mT
        q = (a * eye + b * inner + c * inner @ inner) @ q
    for _ in range(CUBIC_STEPS):
        q = (1.5 * eye - 0.5 * q @ gram @ q.mT) @ q
    return q.to(x.dtype) @ x
