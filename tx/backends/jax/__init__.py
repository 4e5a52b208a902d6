"""The JAX trainer (`tx serve --backend jax`, the `[jax]` extra): the `TrainingBackend` protocol in JAX.

Files: `spec.py` (what a served model is, from its HF config), `model.py` (Qwen3 and Llama 3 forward passes
over plain dicts of arrays), `lora.py` (adapters named as in PEFT files), `shapes.py` (length buckets and
micro-batches by a token budget; no jax), `mesh.py` (the device mesh and shardings), `step.py` (the jitted
passes), `optim.py` (AdamW through optax), `state.py` (tx's checkpoint format to and from JAX arrays),
`backend.py` (`JaxBackend`). Only modules in this package import jax.
"""
