"""Text prompts made tokens in worker processes (issue 38 item 4: a 0.5 MB chat rendered and tokenized in a
thread of the server held its GIL, and so its event loop, for up to a second): the byte bound that refuses a
prompt before it is tokenized is sound (never above the true count), and a prompt too long is refused either way
with a 400's UserError, from the worker."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tx.core.sampling import prompts
from tx.core.sampling.prompts import PromptWorkers, context_of, max_token_bytes
from tx.types import UserError


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_the_byte_bound_never_exceeds_the_token_count(tokenizer: Any) -> None:
    most = max_token_bytes(tokenizer)
    assert most is not None and most >= 1  # tiny-qwen3's tokenizer is byte-level BPE
    normalizer = tokenizer.backend_tokenizer.normalizer
    rng = random.Random(0)
    alphabet = ["x", " ", "\n", "é", "e\u0301", "\u1100\u1161\u11a8", "😀", "<|im_start|>", "ab", "the "]
    texts = ["x" * 8000, " " * 5000, "<|im_start|>" * 100] + [
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 2000))) for _ in range(50)]
    for text in texts:
        size = len((normalizer.normalize_str(text) if normalizer else text).encode())
        assert -(-size // most) <= len(tokenizer.encode(text, add_special_tokens=False)), text[:40]


def test_only_byte_level_tokenizers_get_a_bound() -> None:
    class Whitespace:  # the shape of a WordPiece tokenizer's backend: a pre-tokenizer that drops whitespace
        backend_tokenizer = type("B", (), {"to_str": lambda self: '{"pre_tokenizer": {"type": "Whitespace"}}'})()

    assert max_token_bytes(Whitespace()) is None
    assert prompts._keeps_every_byte({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "behavior": "Isolated"}, {"type": "ByteLevel"}]})
    assert not prompts._keeps_every_byte({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "behavior": "Removed"}, {"type": "ByteLevel"}]})


def test_context_counts_rope_scaling(tmp_path: Path, tiny_model_dir: Path) -> None:
    assert context_of(tiny_model_dir) == 2048
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 1000, "rope_scaling": {"factor": 4.0}}')
    assert context_of(tmp_path) == 4000
    assert context_of(tmp_path / "missing") is None


def test_a_chat_too_long_is_refused_in_the_worker_and_a_short_one_tokenized(tiny_model_dir: Path,
                                                                             tokenizer: Any) -> None:
    workers = PromptWorkers({"tiny": tiny_model_dir}, 1)
    big = [{"role": "user", "content": "x" * 8000}] * 64
    short = [{"role": "user", "content": "hi"}]
    two = [{"role": "user", "content": "hi"}] * 2
    two_tokens = len(tokenizer.encode(tokenizer.apply_chat_template(two, tokenize=False, add_generation_prompt=True),
                                      add_special_tokens=False))

    async def run() -> tuple[list[int], str, str, str]:
        tokens = await workers.chat("tiny", short, 8)
        refusals = []
        for call in (workers.chat("tiny", big, 8), workers.text("tiny", "x" * 100_000, 8),
                     workers.chat("tiny", two, 2048 - two_tokens + 1)):  # the bound lets it by; its count not
            with pytest.raises(UserError) as caught:
                await call
            refusals.append(str(caught.value))
        return tokens, *refusals

    try:
        tokens, big_chat, big_text, counted = asyncio.run(run())
    finally:
        workers.close()
    expected = tokenizer.apply_chat_template(short, tokenize=False, add_generation_prompt=True)
    assert tokens == tokenizer.encode(expected, add_special_tokens=False)
    assert "at least" in big_chat and "exceeds the model's 2048" in big_chat  # refused by the bound
    assert "at least" in big_text
    assert "prompt + max_tokens = " in counted and "exceeds the model's 2048" in counted  # refused by the count
