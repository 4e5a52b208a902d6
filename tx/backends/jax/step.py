"""The jitted passes: the loss of one micro-batch, forward only or with LoRA gradients accumulated; and the
base model's own logprobs of a sequence (the engines' self-check, `JaxBackend.base_logprobs`).

The loss is the shared per-token formula (`tx.backends.losses`) over JAX arrays, masked and summed. The model
spec and the loss name are static (one compilation per model, loss and input shape); loss_fn_config values
and the LoRA scale are traced, so changing them never recompiles.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from tx.backends.jax import model
from tx.backends.jax.spec import ModelSpec
from tx.backends.losses import ArrayOps, get_loss

JAX_OPS = ArrayOps(exp=jnp.exp, minimum=jnp.minimum, clip=jnp.clip, stop_gradient=jax.lax.stop_gradient)

Batch = Mapping[str, Any]  # input_ids, targets, mask: arrays; inputs: a dict of the loss's float input arrays


def _loss(lora, base, batch: Batch, scale, config, spec: ModelSpec, loss_name: str):
    logits = model.logits(spec, base, lora, scale, batch["input_ids"])
    logp = model.target_logprobs(logits, batch["targets"])
    terms = get_loss(loss_name).compute(JAX_OPS, logp, batch["inputs"], config)
    return jnp.where(batch["mask"], terms, 0.0).sum(), logp


@partial(jax.jit, static_argnames=("spec", "loss_name"))
def forward(base, lora, batch: Batch, scale, config, *, spec: ModelSpec, loss_name: str):
    """(loss, (R, T, K) logprobs) of one micro-batch."""
    return _loss(lora, base, batch, scale, config, spec, loss_name)


@partial(jax.jit, static_argnames=("spec", "loss_name"))
def forward_backward(base, lora, grads, batch: Batch, scale, config, *, spec: ModelSpec, loss_name: str):
    """(loss, logprobs, grads + the gradient of this micro-batch's loss with respect to `lora`)."""
    value_and_grad = jax.value_and_grad(_loss, has_aux=True)
    (loss, logp), new = value_and_grad(lora, base, batch, scale, config, spec, loss_name)
    return loss, logp, jax.tree.map(jnp.add, grads, new)


@partial(jax.jit, static_argnames=("spec",))
def base_logprobs(base, input_ids, *, spec: ModelSpec):
    """(1, T - 1) logprobs of each token of a (1, T) sequence given the ones before it: the base model alone."""
    logits = model.logits(spec, base, {}, jnp.float32(0.0), input_ids)
    return model.target_logprobs(logits[:, :-1], input_ids[:, 1:, None])[..., 0]
