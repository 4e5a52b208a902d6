"""The checks every engine makes of a request's prompt scores (`target_token_ids`, `prompt_alt_tokens_k`) before
it queues it: a bad one is a 400 here, never a failed batch."""

from __future__ import annotations

import json
from pathlib import Path

from tx.inference.protocol import GenerateRequest
from tx.types import MAX_PROMPT_ALT_CELLS, UserError


def check_prompt_scores(request: GenerateRequest, vocab_size: int | None) -> None:
    """`vocab_size` None: unknown (ids are then checked by the model itself)."""
    length = len(request.prompt_token_ids)
    target = request.target_token_ids
    if (target is not None or request.prompt_alt_tokens_k) and request.images:
        raise UserError("target_prompt_logprobs and prompt_alt_tokens_k need a text-only prompt")
    if target is not None:
        if len(target) != length - 1:
            raise UserError(f"target_prompt_logprobs needs len(prompt) - 1 = {length - 1} rows, got {len(target)}")
        widths = {len(row) for row in target}
        if len(widths) > 1:
            raise UserError("target_prompt_logprobs rows must all have the same width")
        bad = [t for row in target for t in row if t < -1 or (vocab_size is not None and t >= vocab_size)]
        if bad:
            raise UserError(f"target_prompt_logprobs ids outside [-1, {vocab_size or 'the vocabulary'}): {bad[:5]}")
    if request.prompt_alt_tokens_k and length * request.prompt_alt_tokens_k > MAX_PROMPT_ALT_CELLS:
        raise UserError(f"len(prompt) x prompt_alt_tokens_k = {length * request.prompt_alt_tokens_k} is over "
                        f"{MAX_PROMPT_ALT_CELLS}")


def model_vocab_size(model_dir: Path) -> int | None:
    """The vocabulary size a model directory's config.json declares (a vision-language model's text config's)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    return int(size) if isinstance(size, int) else None
