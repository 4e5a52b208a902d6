"""Token ids -> text a token at a time, in time linear in the tokens (`IncrementalDetokenizer`).

Decoding a whole sequence again at every token (to learn what the token added) costs the square of its length;
a 2,047-token completion with n=16 held a server's event loop for seconds that way. Here each token decodes a
short window only: the tokens since the last emitted piece plus the piece before them, as context (byte-level
and sentencepiece tokenizers render a token differently after a space or inside a UTF-8 character). A token
whose text ends inside a UTF-8 character (it decodes to a trailing U+FFFD) emits nothing until the character
completes, or until the window holds `MAX_PENDING` tokens (then the replacement character is emitted, as a whole
decode would).

The pieces joined are the whole decode of the tokens (`tokenizer.decode(tokens, skip_special_tokens=...)`) for
byte-level BPE tokenizers, the kind tx serves; the streaming routes use the same object to send each piece as
its token arrives. Not thread-safe: one per sequence.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

MAX_PENDING = 16  # tokens held back waiting for a UTF-8 character to complete
_INCOMPLETE = "\ufffd"


class Decoder(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder | Any, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._tokens: list[int] = []
        self._prefix = 0  # window start: the tokens of the last emitted piece, as context
        self._read = 0  # tokens up to here have been emitted
        self.text = ""  # everything emitted so far

    def push(self, token: int) -> str:
        """Add one token; the text it completes ("" while a character is incomplete or it adds no text)."""
        self._tokens.append(token)
        return self._emit(force=len(self._tokens) - self._read >= MAX_PENDING)

    def extend(self, tokens: Iterable[int]) -> list[str]:
        """`push` each token; one piece per token."""
        return [self.push(token) for token in tokens]

    def flush(self) -> str:
        """The text of tokens still held back (an incomplete character at the end, as a whole decode shows it)."""
        return self._emit(force=True) if self._read < len(self._tokens) else ""

    def _emit(self, force: bool) -> str:
        before = self._decode(self._tokens[self._prefix:self._read])
        after = self._decode(self._tokens[self._prefix:])
        if len(after) <= len(before) or (after.endswith(_INCOMPLETE) and not force):
            if force:  # nothing new to show: the held tokens add no text
                self._prefix, self._read = self._read, len(self._tokens)
            return ""
        piece = after[len(before):]
        self._prefix, self._read = self._read, len(self._tokens)
        self.text += piece
        return piece

    def _decode(self, tokens: list[int]) -> str:
        return self._tokenizer.decode(tokens, skip_special_tokens=self._skip) if tokens else ""


def decode_pieces(tokenizer: Decoder | Any, tokens: Iterable[int]) -> list[str]:
    """One text piece per token (the last also holds what `flush` released); joined, the sequence's text."""
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = detokenizer.extend(tokens)
    tail = detokenizer.flush()
    if tail:
        pieces[-1] += tail
    return pieces
