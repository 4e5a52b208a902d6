"""The loss functions a client names in `forward_backward`, and the checks on their inputs.

Every loss is a SUM over tokens and datums: the client normalises through its weights or
advantages, so nothing here divides by a count. Each loss is written per token; `logp` is the
trainer's log-probability of the target token, `q` the sampler's (`logprobs` input), `A` the
`advantages` input, `r = exp(logp - q)` the importance ratio and `sg` a stop-gradient.

Inputs are per datum and aligned with the datum's tokens: `target_tokens` is int64 of shape (N,)
or (N, K) (K candidate targets per position, e.g. for distillation), and every other input has
the same shape. Padding positions are removed by the caller's mask, never by the formulas, and
hold 0 in every input.

gspo is sequence-level: it averages log-ratios over each datum's tokens. The batch holds one datum
per row (axis 0), and `_datum_mean` is the one place that relies on it.

The formulas are written once for every backend: each takes the backend's `ArrayOps` (exp, minimum,
clip, stop_gradient of its array library) first, so torch tensors and JAX arrays go through the same
lines. This module imports neither library.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from typing import Any

import numpy as np

from tx.types import ForwardBackwardInput, ProvenanceSpan, UserError

TARGET_KEY = "target_tokens"
SAMPLED_KEY = "_sampled"  # derived, not sent: 1 at target rows a SampledProvenanceSpan covers
Array = Any  # a torch.Tensor, a jax.Array or a numpy array: whatever the backend's ArrayOps work on
Inputs = Mapping[str, Array]


@dataclass(frozen=True)
class ArrayOps:
    """The few array functions the loss formulas need, from one array library."""

    exp: Callable[[Array], Array]
    minimum: Callable[[Array, Array], Array]
    clip: Callable[[Array, float, float], Array]  # clip(x, low, high)
    stop_gradient: Callable[[Array], Array]


NUMPY_OPS = ArrayOps(exp=np.exp, minimum=np.minimum, clip=np.clip, stop_gradient=lambda x: x)
"""numpy's: for checking a formula by hand (numpy has no gradients to stop)."""

Compute = Callable[[ArrayOps, Array, Inputs, Mapping[str, float]], Array]


@dataclass(frozen=True)
class LossFn:
    """A loss: its float inputs (besides `target_tokens`), its config keys and its per-token terms."""

    name: str
    compute: Compute
    required: tuple[str, ...] = ()
    defaults: Mapping[str, float] = field(default_factory=dict)  # optional input -> fill value
    config: Mapping[str, float] = field(default_factory=dict)  # config key -> default
    needs_provenance: bool = False  # derive SAMPLED_KEY from the datum's loss_fn_input_spans

    @property
    def float_inputs(self) -> tuple[str, ...]:
        return self.required + tuple(self.defaults)

    def resolve_config(self, given: Mapping[str, float | str]) -> dict[str, float]:
        """The loss_fn_config with defaults filled in; a UserError for unknown or non-numeric keys."""
        unknown = sorted(set(given) - set(self.config))
        if unknown:
            accepted = ", ".join(sorted(self.config)) or "none"
            raise UserError(
                f"loss_fn_config keys {unknown} are not used by {self.name} (it accepts: {accepted})"
            )
        resolved = dict(self.config)
        for key, value in given.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                raise UserError(f"loss_fn_config[{key!r}] must be a finite number, got {value!r}")
            resolved[key] = float(value)
        _check_config(resolved)
        return resolved

    def validate_datum(
        self,
        inputs: Mapping[str, np.ndarray],
        num_tokens: int,
        index: int,
        spans: tuple[ProvenanceSpan, ...] = (),
    ) -> dict[str, np.ndarray]:
        """Datum `index`'s inputs as int64 targets and float32 arrays of the targets' shape.

        Optional inputs that are absent get their default; keys this loss does not use are ignored.
        `spans` is the datum's target-row provenance (only losses with `needs_provenance` read it).
        """
        targets = _target_tokens(inputs, num_tokens, index)
        arrays = {TARGET_KEY: targets}
        for key in self.required:
            if key not in inputs:
                raise UserError(f"datum {index}: loss_fn_inputs lacks {key!r}, which {self.name} needs")
        for key in self.float_inputs:
            if key in inputs:
                arrays[key] = _float_input(inputs[key], key, targets.shape, index)
            else:
                arrays[key] = np.full(targets.shape, self.defaults[key], dtype=np.float32)
        if self.needs_provenance:
            arrays[SAMPLED_KEY] = _sampled_rows(self.name, spans, targets.shape, index)
            _check_advantages_sampled(arrays, index)
        return arrays


def _sampled_rows(loss: str, spans: tuple[ProvenanceSpan, ...], shape: tuple[int, ...], index: int) -> np.ndarray:
    """1.0 at the target rows that sampled spans cover, 0.0 at prompt rows, in the targets' shape."""
    if not spans:
        raise UserError(
            f"datum {index}: {loss} needs provenance: attach loss_fn_input_spans with "
            "Datum.with_provenance, naming the sampled sequence behind each target row"
        )
    covered = sum(span.length for span in spans)
    if covered != shape[0]:
        raise UserError(f"datum {index}: loss_fn_input_spans cover {covered} rows, but target_tokens has {shape[0]}")
    rows = np.concatenate([np.full(span.length, float(span.sampled), np.float32) for span in spans])
    return np.broadcast_to(rows.reshape(-1, *([1] * (len(shape) - 1))), shape).astype(np.float32)


def _check_advantages_sampled(arrays: Mapping[str, np.ndarray], index: int) -> None:
    stray = (arrays["advantages"] != 0) & (arrays[SAMPLED_KEY] == 0)
    if stray.any():
        row = int(np.argwhere(stray)[0][0])
        raise UserError(
            f"datum {index}: 'advantages' must be 0 off sampled tokens, but row {row} "
            "(a prompt row by its provenance) holds a nonzero advantage"
        )


def _check_config(config: Mapping[str, float]) -> None:
    for key in ("clip_low_threshold", "clip_high_threshold"):
        if key in config and not config[key] >= 0:
            raise UserError(f"loss_fn_config[{key!r}] must be >= 0, got {config[key]}")
    if config.get("clip_low_threshold", 0.0) > 1:
        low = config["clip_low_threshold"]
        raise UserError(f"loss_fn_config['clip_low_threshold'] must be <= 1, got {low}")
    for key in ("beta", "kl_coeff"):
        if key in config and not config[key] >= 0:
            raise UserError(f"loss_fn_config[{key!r}] must be >= 0, got {config[key]}")


def _target_tokens(inputs: Mapping[str, np.ndarray], num_tokens: int, index: int) -> np.ndarray:
    if TARGET_KEY not in inputs:
        raise UserError(f"datum {index}: loss_fn_inputs lacks {TARGET_KEY!r}")
    targets = np.asarray(inputs[TARGET_KEY])
    if not np.issubdtype(targets.dtype, np.integer):
        raise UserError(
            f"datum {index}: {TARGET_KEY!r} must hold integers (int64), got dtype {targets.dtype}"
        )
    valid_shape = targets.ndim in (1, 2) and targets.shape[0] == num_tokens
    if not valid_shape or (targets.ndim == 2 and targets.shape[1] < 1):
        raise UserError(
            f"datum {index}: {TARGET_KEY!r} must have shape ({num_tokens},) or ({num_tokens}, K), "
            f"one row per input token; got shape {targets.shape}"
        )
    return targets.astype(np.int64, copy=False)


def _float_input(value: np.ndarray, key: str, shape: tuple[int, ...], index: int) -> np.ndarray:
    array = np.asarray(value)
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise UserError(f"datum {index}: {key!r} must be float32, got dtype {array.dtype}")
    if array.shape != shape:
        raise UserError(
            f"datum {index}: {key!r} must have the shape of {TARGET_KEY!r}, {shape}; got shape {array.shape}"
        )
    array = array.astype(np.float32, copy=False)
    if not np.isfinite(array).all():
        raise UserError(f"datum {index}: {key!r} holds NaN or infinite values")
    return array


def _ratio(xp: ArrayOps, logp: Array, inputs: Inputs) -> Array:
    return xp.exp(logp - inputs["logprobs"])


def _clipped(xp: ArrayOps, ratio: Array, config: Mapping[str, float]) -> Array:
    return xp.clip(ratio, 1.0 - config["clip_low_threshold"], 1.0 + config["clip_high_threshold"])


def cross_entropy(xp: ArrayOps, logp: Array, inputs: Inputs, config: Mapping[str, float]) -> Array:
    """loss = -Σ w·logp, with w = `weights` (1 where absent). Any real weight works, negative too."""
    return -inputs["weights"] * logp


def importance_sampling(xp: ArrayOps, logp: Array, inputs: Inputs, config: Mapping[str, float]) -> Array:
    """loss = -Σ r·A, r = exp(logp - q): the policy gradient, corrected for off-policy samples."""
    return -_ratio(xp, logp, inputs) * inputs["advantages"]


def ppo(xp: ArrayOps, logp: Array, inputs: Inputs, config: Mapping[str, float]) -> Array:
    """loss = -Σ min(r·A, clip(r, 1-low, 1+high)·A), low/high = clip_low/high_threshold (0.2)."""
    ratio, advantages = _ratio(xp, logp, inputs), inputs["advantages"]
    return -xp.minimum(ratio * advantages, _clipped(xp, ratio, config) * advantages)


def cispo(xp: ArrayOps, logp: Array, inputs: Inputs, config: Mapping[str, float]) -> Array:
    """loss = -Σ sg(clip(r, 1-low, 1+high))·A·logp: clipped ratios weight a REINFORCE term."""
    weight = xp.stop_gradient(_clipped(xp, _ratio(xp, logp, inputs), config))
    return -weight * inputs["advantages"] * logp


def dro(xp: ArrayOps, logp: Array, inputs: Inputs, config: Mapping[str, float]) -> Array:
    """loss = -Σ [A·logp - (beta/2)·(logp - q)²], beta from loss_fn_config (default 0.05).

    The quadratic term keeps the policy near the sampler's; beta 0.05 is a mild pull that
    matches the strength of the usual KL coefficients (0.01-0.1).
    """
    return -(inputs["advantages"] * logp - 0.5 * config["beta"] * (logp - inputs["logprobs"]) ** 2)


def _datum_mean(xp: ArrayOps, values: Array, mask: Array) -> Array:
    """Σ mask·values / Σ mask over each datum's positions, shape (B, 1, 1); 0 where the mask is empty."""
    total = (values * mask).sum(axis=(1, 2), keepdims=True)
    return total / xp.clip(mask.sum(axis=(1, 2), keepdims=True), 1.0, float("inf"))


def gspo(xp: ArrayOps, logp: Array, inputs: Inputs, config: Mapping[str, float]) -> Array:
    """loss = -Σ min(s_t·A, clip(s_t, 1-low, 1+high)·A): PPO on one ratio per sequence (GSPO-token).

    s = exp(mean over M of (logp - q)), M the tokens where `sequence_ratio_mask` != 0; every token
    takes s's value with its own logp's gradient: s_t = sg(s)·exp(logp - sg(logp)). Thresholds as
    in ppo (0.2): a whole sequence is kept or clipped by how far its geometric-mean ratio moved.
    """
    in_ratio = (inputs["sequence_ratio_mask"] != 0) * 1.0
    log_ratio = _datum_mean(xp, xp.stop_gradient(logp) - inputs["logprobs"], in_ratio)
    ratio, advantages = xp.exp(log_ratio + logp - xp.stop_gradient(logp)), inputs["advantages"]
    return -xp.minimum(ratio * advantages, _clipped(xp, ratio, config) * advantages)


def stable_reinforce(xp: ArrayOps, logp: Array, inputs: Inputs, config: Mapping[str, float]) -> Array:
    """loss = -Σ_S sg(min(r, 1))·A·logp + kl_coeff·Σ_S (r - 1 - log r), r = exp(logp - q).

    tx's StableReinforce (hosted Tinker's formula is not published). S: the sampled tokens, the target rows
    that the datum's SampledProvenanceSpans cover. q: the sampler's own logprob of each, read from the
    stability record its sequence_id names (`record_stability_info`; `tx/backends/provenance.py` writes it
    into `logprobs` at submission, so q is what the engine computed when it drew the token, never a value
    the client rebuilt or rounded). A: `advantages` (0 off S).

    - The policy-gradient term is REINFORCE weighted by the importance ratio truncated at 1: its gradient
      is min(r, 1)·A·∇logp. On-policy (r = 1) it is plain REINFORCE. Off-policy (async RL several steps
      stale, or sampler and trainer rounding differently in bf16), a token the trainer now likes less than
      the sampler did (r < 1) counts for less, as importance sampling would have it; one it likes more
      (r > 1) counts once, never r times. So no stale or mismatched token can scale a step up, which is how
      importance_sampling blows up (its weight r is unbounded), and unlike ppo's clip no token's gradient
      is switched off: every sampled token keeps a bounded, same-signed push. The price is a bias toward
      the sampler on tokens with r > 1, which vanishes as training catches up with sampling.
    - The KL term is the k3 estimate of KL(q || p) over the sampled tokens (unbiased, non-negative, with
      samples drawn from q): a pull back toward the sampler, kl_coeff (loss_fn_config, default 0) strong.
    """
    log_ratio = logp - inputs["logprobs"]
    weight = xp.stop_gradient(xp.clip(xp.exp(log_ratio), 0.0, 1.0))
    kl = xp.exp(log_ratio) - 1.0 - log_ratio
    return -weight * inputs["advantages"] * logp + config["kl_coeff"] * inputs[SAMPLED_KEY] * kl


_CLIP = {"clip_low_threshold": 0.2, "clip_high_threshold": 0.2}
_RL_INPUTS = ("logprobs", "advantages")

LOSSES: dict[str, LossFn] = {
    loss.name: loss
    for loss in (
        LossFn("cross_entropy", cross_entropy, defaults={"weights": 1.0}),
        LossFn("importance_sampling", importance_sampling, required=_RL_INPUTS),
        LossFn("ppo", ppo, required=_RL_INPUTS, config=_CLIP),
        LossFn("cispo", cispo, required=_RL_INPUTS, config=_CLIP),
        LossFn("dro", dro, required=_RL_INPUTS, config={"beta": 0.05}),
        LossFn("gspo", gspo, required=(*_RL_INPUTS, "sequence_ratio_mask"), config=_CLIP),
        LossFn(  # logprobs: the recorded ones, written at submission (provenance.py); a client may omit them
            "stable_reinforce", stable_reinforce, required=("advantages",), defaults={"logprobs": 0.0},
            config={"kl_coeff": 0.0}, needs_provenance=True,
        ),
    )
}


def get_loss(name: str) -> LossFn:
    """The loss called `name`; a UserError listing the supported ones otherwise."""
    if name not in LOSSES:
        raise UserError(f"unsupported loss_fn {name!r}: this server supports {', '.join(LOSSES)}")
    return LOSSES[name]


def _no_formula(*_: Any) -> Any:
    raise AssertionError("a custom loss runs its graph, not a per-token formula")


TARGETS_ONLY = LossFn("custom", _no_formula)
"""A custom loss's datum checks: target_tokens only (its graph checks the inputs it reads when it runs)."""


def batch_loss(batch: ForwardBackwardInput) -> tuple[LossFn, dict[str, float]]:
    """The loss that checks `batch`'s datums, and its config with defaults; a UserError for an unknown loss or
    config key. A custom loss (attached at submission) takes no config here: its loss_fn_config named it."""
    if batch.custom_loss is not None:
        return TARGETS_ONLY, {}
    loss = get_loss(batch.loss_fn)
    return loss, loss.resolve_config(batch.loss_fn_config)
