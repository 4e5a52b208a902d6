"""Text prompts made tokens in worker processes (`--prompt-workers`), never on the server's interpreter.

A chat template is Python (Jinja), and a fast tokenizer's `encode` holds the GIL: run in a thread of the
server, either stalls its event loop as long as it runs (a 0.5 MB chat: 0.9 s of encoding). Here both run in a
pool of processes, each with its own copy of each base model's tokenizer; the server sends the messages (or
text) and gets back the token ids, never more than the model's context holds.

A prompt that cannot fit is refused before it is tokenized. Characters bound tokens from below only through
bytes: a character is 1-4 bytes of UTF-8, and one token stands for at most M bytes, M being the longest token
of the vocabulary (its added tokens included) in bytes. So a text of B bytes is at least ceil(B / M) tokens,
*if* every byte of the text lands in some token. That holds for byte-level BPE tokenizers (GPT-2, Llama 3,
Qwen: a byte-level pre-tokenizer, after splits that drop nothing), counting B after the tokenizer's own
normalizer (which may add or remove characters, e.g. NFC composing two into one). For any other tokenizer (one
whose pre-tokenizer drops whitespace, say) there is no such bound: its prompt is tokenized in full, in a worker
still, and refused by its count. The context is the model's `max_position_embeddings` times its RoPE scaling
factor, if any: a limit at least the engine's, so nothing the engine would take is refused here (the engine
checks the exact one).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tx.types import OverloadedError, UserError

T = TypeVar("T")
_KEEPING_SPLITS = {"ByteLevel", "Digits", "Punctuation", "Split"}  # pre-tokenizers that drop no character


class PromptWorkers:
    """The pool: `chat` and `text` return a prompt's token ids, or raise UserError (it cannot fit, or the
    template refused the messages)."""

    def __init__(self, model_dirs: dict[str, Path], workers: int) -> None:
        self._dirs = model_dirs
        self._workers = workers
        self._lock = threading.Lock()
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        # spawn: the server holds threads (engines, the trainer), which a fork would copy mid-lock
        return ProcessPoolExecutor(self._workers, mp_context=multiprocessing.get_context("spawn"))

    async def chat(self, base_model: str, messages: list[dict[str, str]], max_tokens: int) -> list[int]:
        return await self._call(_chat_tokens, str(self._dirs[base_model]), base_model, messages, max_tokens)

    async def text(self, base_model: str, text: str, max_tokens: int) -> list[int]:
        return await self._call(_text_tokens, str(self._dirs[base_model]), base_model, text, max_tokens)

    async def _call(self, work: Callable[..., T], *args: Any) -> T:
        pool = self._pool
        try:
            return await asyncio.wrap_future(pool.submit(work, *args))
        except BrokenProcessPool:  # a worker died (killed, out of memory): a fresh pool for the next request
            with self._lock:
                if self._pool is pool:
                    self._pool = self._new_pool()
            raise OverloadedError("a prompt worker stopped; retry") from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# --- in the worker processes ---


@dataclass(frozen=True)
class _Loaded:
    tokenizer: Any
    max_token_bytes: int | None  # the most bytes one token stands for; None: no sound bound (see the module)
    context: int | None


_LOADED: dict[str, _Loaded] = {}


def _chat_tokens(directory: str, base_model: str, messages: list[dict[str, str]], max_tokens: int) -> list[int]:
    loaded = _load(directory)
    try:
        text = loaded.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # a template that raises on these messages (e.g. roles out of order)
        raise UserError(f"the chat template of {base_model!r} refused these messages: {exc}") from None
    return _encode(loaded, text, max_tokens)


def _text_tokens(directory: str, base_model: str, text: str, max_tokens: int) -> list[int]:
    return _encode(_load(directory), text, max_tokens)


def _encode(loaded: _Loaded, text: str, max_tokens: int) -> list[int]:
    if loaded.context is not None and loaded.max_token_bytes:
        normalizer = loaded.tokenizer.backend_tokenizer.normalizer
        size = len((normalizer.normalize_str(text) if normalizer else text).encode("utf-8", "surrogatepass"))
        least = -(-size // loaded.max_token_bytes)
        if least + max_tokens > loaded.context:
            raise UserError(f"prompt + max_tokens >= {least + max_tokens} exceeds the model's {loaded.context} "
                            f"(the prompt's {size} bytes are at least {least} tokens of at most "
                            f"{loaded.max_token_bytes} bytes)")
    tokens = loaded.tokenizer.encode(text, add_special_tokens=False)
    if loaded.context is not None and len(tokens) + max_tokens > loaded.context:
        raise UserError(f"prompt + max_tokens = {len(tokens) + max_tokens} exceeds the model's {loaded.context}")
    return tokens


def _load(directory: str) -> _Loaded:
    if (found := _LOADED.get(directory)) is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory)
        found = _LOADED[directory] = _Loaded(tokenizer, max_token_bytes(tokenizer), context_of(Path(directory)))
    return found


def max_token_bytes(tokenizer: Any) -> int | None:
    """M of the module's bound for a byte-level BPE tokenizer (None for any other): the longest token's text in
    UTF-8 bytes. A byte-level token's text has one character per byte it stands for, each 1 or 2 bytes of UTF-8,
    so this is at least the bytes it stands for; an added token stands for its own text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not _keeps_every_byte(json.loads(backend.to_str()).get("pre_tokenizer")):
        return None
    return max(len(token.encode("utf-8", "surrogatepass")) for token in tokenizer.get_vocab())


def _keeps_every_byte(pre: dict | None) -> bool:
    if not pre:
        return False
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    return any(p.get("type") == "ByteLevel" for p in parts) and all(
        p.get("type") in _KEEPING_SPLITS and p.get("behavior") != "Removed" for p in parts)


def context_of(model_dir: Path) -> int | None:
    """The model's context for the early refusal: `max_position_embeddings` times its RoPE scaling factor (a
    limit no lower than the engine's); None when the config does not say."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return None
    text = config.get("text_config") or config
    positions = text.get("max_position_embeddings") or config.get("max_position_embeddings")
    if not isinstance(positions, int):
        return None
    scaling = text.get("rope_scaling") or text.get("rope_parameters") or {}
    factor = scaling.get("factor", 1.0) if isinstance(scaling, dict) else 1.0
    return int(positions * max(1.0, float(factor or 1.0)))
