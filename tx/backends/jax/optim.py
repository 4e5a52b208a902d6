"""AdamW through optax, with every `AdamParams` field applied on every step.

The hyperparameters live in the optimizer state (`optax.inject_hyperparams`) and are overwritten before each
update, so a client may change any of them between steps without a recompile. Clipping follows torch's
`clip_grads_with_norm_` (scale by max_norm / (norm + 1e-6) when that is below 1), so both backends move
the same weights the same way.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tx.optimizers import AdamParams

_ADAMW = optax.inject_hyperparams(optax.adamw)(
    learning_rate=0.0, b1=0.9, b2=0.95, eps=1e-12, weight_decay=0.0
)


def new_state(lora) -> optax.OptState:
    return _ADAMW.init(lora)


@jax.jit
def _apply(lora, grads, state, hyperparams, clip):
    norm = optax.tree.norm(grads)
    factor = jnp.where(clip > 0, jnp.minimum(1.0, clip / (norm + 1e-6)), 1.0)
    grads = jax.tree.map(lambda g: g * factor, grads)
    state = state._replace(hyperparams={**state.hyperparams, **hyperparams})
    updates, state = _ADAMW.update(grads, state, lora)
    return optax.apply_updates(lora, updates), state, norm


def adam_step(lora, grads, state, adam: AdamParams):
    """(new LoRA weights, new state, metrics) after one AdamW step on the accumulated `grads`."""
    hyperparams = {
        "learning_rate": adam.learning_rate, "b1": adam.beta1, "b2": adam.beta2,
        "eps": adam.eps, "weight_decay": adam.weight_decay,
    }
    hyperparams = {key: np.float32(value) for key, value in hyperparams.items()}
    lora, state, norm = _apply(lora, grads, state, hyperparams, np.float32(adam.grad_clip_norm))
    return lora, state, {"grad_norm": float(norm), "learning_rate": adam.learning_rate}


def moments(state) -> tuple[Any, Any, int]:  # (pytrees of arrays, an int)
    """(first moments, second moments, step count) of an AdamW state."""
    adam = state.inner_state[0]
    return adam.mu, adam.nu, int(adam.count)


def with_moments(state, mu, nu, count: int):
    """`state` with its AdamW moments and step count replaced (adamw = scale_by_adam, then decay and lr)."""
    adam, *rest = state.inner_state
    assert isinstance(adam, optax.ScaleByAdamState), type(adam)
    step = jnp.asarray(count, jnp.int32)
    return state._replace(count=step, inner_state=(adam._replace(count=step, mu=mu, nu=nu), *rest))
