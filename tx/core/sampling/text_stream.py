"""One choice's text as its tokens arrive: the streaming side of `text.py`.

`TextStream.push(tokens)` returns the text those tokens add, never anything the finished choice would not hold:
the text (decoded a token at a time, `detokenize.IncrementalDetokenizer`, which holds back a character split
across tokens) is cut before the first stop string, as `text.py` cuts the whole choice, and the last characters
that could still begin a stop string are held back until the next tokens say otherwise. What was sent is always
a prefix of the choice's final text; `rest(final_text)` is what remains of it. Tokenizer work: call `push` the
way `text.py` runs any (`TextSampling.stream_text`).
"""

from __future__ import annotations

from typing import Any

from tx.core.sampling.detokenize import IncrementalDetokenizer


class TextStream:
    def __init__(self, tokenizer: Any, stop_strings: tuple[str, ...]) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer)
        self._stops = tuple(stop for stop in stop_strings if stop)
        self._hold = max((len(stop) for stop in self._stops), default=1) - 1
        self.sent = ""
        self.stopped = False

    def push(self, tokens: list[int]) -> str:
        """The text `tokens` add that is certain to stay; empty when none is yet (or the text reached a stop)."""
        if self.stopped:
            return ""
        self._detokenizer.extend(tokens)
        full = self._detokenizer.text
        cuts = [i for i in (full.find(stop) for stop in self._stops) if i >= 0]
        if cuts:
            self.stopped = True
            safe = full[: min(cuts)]
        else:
            safe = full[: len(full) - self._hold] if self._hold else full
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        piece, self.sent = safe[len(self.sent):], safe
        return piece

    def rest(self, final_text: str) -> str:
        """What the finished choice's text holds beyond what was sent."""
        return final_text[len(self.sent):] if final_text.startswith(self.sent) else ""
