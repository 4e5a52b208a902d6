"""The OpenAI-compatible routes' text: decoded a token at a time in linear time, and every tokenizer call off
the event loop (the shared-server probe's finding 2: max_tokens=2047, n=16 held every route for 3.9 s)."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tx.core.sampling.detokenize import IncrementalDetokenizer, decode_pieces
from tx.core.sampling.prompts import PromptWorkers
from tx.core.sampling.text import TextSampling
from tx.types import SampledSequence, SampleResult, SamplingParams, StopReason


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_pieces_join_to_the_whole_decode(tokenizer: Any) -> None:
    rng = random.Random(0)
    for length in (0, 1, 2, 7, 64, 300):
        tokens = [rng.randrange(len(tokenizer)) for _ in range(length)]
        pieces = decode_pieces(tokenizer, tokens)
        assert len(pieces) == length
        assert "".join(pieces) == tokenizer.decode(tokens, skip_special_tokens=True)
    text = "naïve café 😀 ok"  # multi-byte characters split over byte-level tokens
    tokens = tokenizer.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    streamed = [detokenizer.push(token) for token in tokens] + [detokenizer.flush()]
    assert "".join(streamed) == text and "\ufffd" not in "".join(streamed)


def test_streamed_text_never_passes_a_stop_string(tokenizer: Any) -> None:
    from tx.core.sampling.text import _choice
    from tx.core.sampling.text_stream import TextStream

    text = "The cat sat on the mat. STOP here and more text after it"
    tokens = tokenizer.encode(text, add_special_tokens=False)
    for stops in (("STOP",), ("at.", "zz-never"), ()):
        stream = TextStream(tokenizer, stops)
        pieces = [stream.push([token]) for token in tokens]
        final = _choice(tokenizer, SampledSequence(tokens, [0.0] * len(tokens), StopReason.STOP), stops).text
        sent = "".join(pieces)
        assert final.startswith(sent) and sent + stream.rest(final) == final
        assert not any(stop in sent for stop in stops)
        if not stops:
            assert sent == text, "without stop strings nothing is held back"


class Counting:
    """The real tokenizer, counting the tokens every decode call reads and the threads every call runs on."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.decoded = 0
        self.threads: set[int] = set()
        self.chat_template = inner.chat_template

    def __len__(self) -> int:
        return len(self.inner)

    def decode(self, tokens: list[int], **options: Any) -> str:
        self.threads.add(threading.get_ident())
        self.decoded += len(tokens)
        return self.inner.decode(tokens, **options)

    def encode(self, text: str, **options: Any) -> list[int]:
        self.threads.add(threading.get_ident())
        return self.inner.encode(text, **options)

    def apply_chat_template(self, *args: Any, **options: Any) -> Any:
        self.threads.add(threading.get_ident())
        return self.inner.apply_chat_template(*args, **options)


class CannedSampling:
    """A fake of SamplingService.generate (no engine here): n sequences of random tokens."""

    def __init__(self, length: int, vocab: int) -> None:
        self.length, self.vocab = length, vocab

    async def generate(self, owner: str, base_model: str, weights_dir: Any, label: str, request: Any,
                       on_tokens: Any = None) -> SampleResult:
        rng = random.Random(1)
        sequences = [SampledSequence(tokens=[rng.randrange(self.vocab) for _ in range(self.length)],
                                     logprobs=[-1.0] * self.length, stop_reason=StopReason.LENGTH)
                     for _ in range(request.num_samples)]
        return SampleResult(sequences=sequences)


class BaseOnly:
    def target(self, owner: str, model: str) -> tuple[str, None]:
        return model, None


def test_completions_decode_in_linear_time_off_the_loop(tiny_model_dir: Path, tokenizer: Any) -> None:
    length, n = 2000, 4  # with the chat prompt, within the tiny model's 2,048 positions
    counting = Counting(tokenizer)
    text = TextSampling(BaseOnly(), CannedSampling(length, len(tokenizer)),
                        {"tiny": tiny_model_dir}, PromptWorkers({"tiny": tiny_model_dir}, 1))
    text._tokenizers["tiny"] = counting

    async def run() -> tuple[int, Any, Any]:
        params = SamplingParams(max_tokens=length)
        done = await text.complete("me", "tiny", "hello there", params, n)
        chat = await text.chat("me", "tiny", [{"role": "user", "content": "hi"}], params, 1)
        return threading.get_ident(), done, chat

    try:
        loop_thread, result, chat = asyncio.run(run())
    finally:
        text.close()
    assert len(result.choices) == n and all(len(c.pieces) == length for c in result.choices)
    assert result.choices[0].text == "".join(result.choices[0].pieces)
    assert counting.decoded < 8 * (n + 1) * length  # a whole decode per token read ~length**2 / 2 per sequence
    assert loop_thread not in counting.threads and counting.threads
    assert chat.choices[0].text
