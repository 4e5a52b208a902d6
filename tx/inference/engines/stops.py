"""Stop strings across an abort: the text a resumed sample generated before the pause counts too.

A sample aborted by a pause is resent with its tokens so far at the end of the prompt
(`GenerateRequest.resumed_tokens` says how many). A stop string may start in that earlier text and end
in the new one ("\\n" + "\\n" for "\\n\\n"), so engines match stop strings on the tail of the earlier text
followed by the new text. Only a match that ends in the new text counts: one wholly inside the earlier
text would have stopped the sample before the abort.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tx.inference.protocol import GenerateRequest, GenerateResponse

Decode = Callable[[list[int]], str]
EXTRA_TAIL_TOKENS = 4  # beyond one token per character of the longest stop string


class LazyDecode:
    """The model's tokenizer's decode as stop-string matching decodes, loaded on first use (off the loop)."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self._decode: Decode | None = None

    async def get(self) -> Decode:
        if self._decode is None:
            from transformers import AutoTokenizer

            tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, str(self.model_dir))
            self._decode = functools.partial(tokenizer.decode, skip_special_tokens=False)
        return self._decode


def resumed_tail(prompt_token_ids: Sequence[int], resumed_tokens: int, stop_strings: Sequence[str]) -> list[int]:
    """The earlier generated tokens that can take part in a stop-string match (a stop string of L
    characters spans at most L tokens, as every token decodes to at least one character)."""
    if resumed_tokens <= 0 or not stop_strings:
        return []
    keep = min(resumed_tokens, max(len(s) for s in stop_strings) + EXTRA_TAIL_TOKENS)
    return list(prompt_token_ids[len(prompt_token_ids) - keep:])


def hits_stop_string(decode: Decode, tail: list[int], generated: list[int], stop_strings: Sequence[str]) -> bool:
    """Whether `tail + generated` decodes to text holding a stop string that ends after the tail's text."""
    text = decode(tail + generated)
    tail_len = len(decode(tail)) if tail else 0
    return any(text.find(stop, max(0, tail_len - len(stop) + 1)) >= 0 for stop in stop_strings)


def first_stop_string_end(decode: Decode, tail: list[int], generated: list[int],
                          stop_strings: Sequence[str]) -> int | None:
    """How many of `generated` to keep so the last kept token completes the first stop-string match,
    or None without a match (for engines that only see the new text and must cut afterwards)."""
    if not stop_strings:
        return None
    for end in range(1, len(generated) + 1):
        if hits_stop_string(decode, tail, generated[:end], stop_strings):
            return end
    return None


def cut_at_resumed_stop(request: GenerateRequest, response: GenerateResponse, decode: Decode) -> GenerateResponse:
    """For engines that match stop strings on the new text only (vLLM): end each sequence of a resumed
    request at the token that completes a stop string starting in the earlier text."""
    tail = resumed_tail(request.prompt_token_ids, request.resumed_tokens, request.stop_strings)
    if not tail:
        return response
    sequences = []
    for seq in response.sequences:
        end = first_stop_string_end(decode, tail, seq.token_ids, request.stop_strings)
        if end is not None and (end < len(seq.token_ids) or seq.stop_reason != "stop"):
            seq = seq.model_copy(update={
                "token_ids": seq.token_ids[:end], "logprobs": seq.logprobs[:end], "stop_reason": "stop",
            })
        sequences.append(seq)
    return response.model_copy(update={"sequences": sequences})
