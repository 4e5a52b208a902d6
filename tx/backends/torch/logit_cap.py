"""Whether a base model softcaps its logits, decided once by a self-check when it loads.

The trainer never takes a model's logits: it runs the body with the model's own forward, keeps the hidden states
the model feeds its head (`lm_head`), and runs the head itself a chunk of positions at a time (`logprobs.py`).
Some models change the head's output before it is their logits: Mistral Large 4 and Inkling 2 (like Gemma 2)
softcap them, cap * tanh(logits / cap), the cap in their config's `final_logit_softcapping` (30). The trainer
must do the same, or its logprobs are not the model's (the sampler's, which come from the model's forward).

So tx does not trust the config alone. `choose_logit_cap` runs one random row through the model with a hook on
its head that keeps the head's output, and takes the first form whose log-softmax matches the model's own
logits: softcapped at the config's `final_logit_softcapping` (where it has one), then the head's output as is.
A model whose logits are neither cannot be trained here: a UserError (a 400 at create_model) says so.

Inkling's logits keep only the first `unpadded_vocab_size` rows of its head (the rest pad the vocabulary): the
check compares those rows, and logs that the trainer's head still scores every row
(docs/model-families.md#logits-softcapped-or-not).
"""

from __future__ import annotations

import logging

import torch
from transformers import PreTrainedModel

from tx.models.agreement import difference, tolerance
from tx.types import UserError

logger = logging.getLogger(__name__)

CHECK_LENGTH = 16
CHECK_SEED = 0


def choose_logit_cap(model: PreTrainedModel, name: str) -> float | None:
    """The cap the model's logits are softcapped at (None: none), as the module docstring decides it."""
    head = model.get_output_embeddings()
    if head is None:
        raise UserError(f"{name}: {type(model).__name__} has no output embeddings (lm_head) to train")
    config = model.config.get_text_config()
    generator = torch.Generator().manual_seed(CHECK_SEED)
    ids = torch.randint(0, int(config.vocab_size), (1, CHECK_LENGTH), generator=generator).to(model.device)
    seen: list[torch.Tensor] = []
    hook = head.register_forward_hook(lambda _module, _args, output: seen.append(output))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0].float()
    finally:
        hook.remove()
    if len(seen) != 1:
        raise UserError(f"{name}: its forward called its head {len(seen)} times (tx's trainer runs it once)")
    output = seen[0][0].float()
    rows = logits.shape[-1]
    if rows < output.shape[-1]:
        logger.info("%s: its logits keep %d of its head's %d rows; tx's trainer scores all of them", name, rows,
                    output.shape[-1])
    want = torch.log_softmax(logits, dim=-1)
    cap = getattr(config, "final_logit_softcapping", None)
    errors = []
    for candidate in ([float(cap)] if cap else []) + [None]:
        got = output if candidate is None else torch.tanh(output / candidate) * candidate
        error = difference(torch.log_softmax(got[:, :rows], dim=-1), want, model.dtype == torch.float32)
        if error <= tolerance(model.dtype):
            logger.info("%s: logits %s (the trainer's head and the model's differ by %.2g)", name,
                        "as its head gives them" if candidate is None else f"softcapped at {candidate:g}", error)
            return candidate
        errors.append(f"{'no softcap' if candidate is None else f'softcapped at {candidate:g}'}: {error:.3g}")
    raise UserError(f"{name}: its logits are not its head's output, softcapped or not ({'; '.join(errors)}), "
                    "so tx's trainer cannot give its logprobs")
