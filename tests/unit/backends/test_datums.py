"""The datum rules at submission (`tx/backends/datums.py`), row by row, with no model: what is refused before a
request is queued, and what is left for execution (an image's real token count)."""

from __future__ import annotations

import numpy as np
import pytest

from tx.backends.datums import DatumRules, check_batch
from tx.multimodal import ImageLimits
from tx.types import BaseModelInfo, Datum, ForwardBackwardInput, ImageChunk, ModelInput, TextChunk, UserError

INFO = BaseModelInfo(name="m", arch="A", tokenizer_id="-", vocab_size=100, max_context_length=32)
TEXT = DatumRules(INFO)
VISION = DatumRules(INFO, max_tokens=24, takes_images=True, image_limits=ImageLimits(max_bytes=64))


def text_datum(tokens: list[int], targets: int | None = None) -> Datum:
    return Datum(ModelInput.from_tokens(tokens), {"target_tokens": np.ones(targets or len(tokens), np.int64)})


def image_datum(expected: int | None, targets: int, data: bytes = b"png") -> Datum:
    chunks = (TextChunk((1, 2)), ImageChunk(data, "png", expected), TextChunk((3,)))
    return Datum(ModelInput(chunks), {"target_tokens": np.ones(targets, np.int64)})


def batch(*data: Datum, loss: str = "cross_entropy", **config: float | str) -> ForwardBackwardInput:
    return ForwardBackwardInput(list(data), loss, dict(config))


@pytest.mark.parametrize("request_, rules, refusal", [
    (batch(), TEXT, "at least one datum"),
    (batch(text_datum([1, 2]), loss="nope"), TEXT, "unsupported loss_fn 'nope'"),
    (batch(text_datum([1, 2]), beta=0.1), TEXT, r"\['beta'\] are not used by cross_entropy"),
    (batch(text_datum([1, 2]), text_datum([1] * 33)), TEXT, "datum 1: 33 tokens exceed the maximum context length 32"),
    (batch(text_datum([1] * 25)), VISION, "datum 0: 25 tokens exceed this server's limit of 24"),
    (batch(text_datum([1, 100])), TEXT, r"datum 0: token id 100 is outside the vocabulary \[0, 100\)"),
    (batch(text_datum([-1, 2])), TEXT, "datum 0: token id -1"),
    (batch(text_datum([1, 2], targets=3)), TEXT, r"datum 0: 'target_tokens' must have shape \(2,\)"),
    (batch(image_datum(4, targets=7)), TEXT, "datum 0: this model takes text only"),
    (batch(image_datum(30, targets=33)), VISION, "datum 0: 33 tokens exceed the maximum context length 32"),
    (batch(image_datum(4, targets=6)), VISION, r"datum 0: 'target_tokens' must have shape \(7,\)"),
    (batch(image_datum(None, targets=1, data=b"x" * 65)), VISION, "datum 0: chunk 1: image of 65 bytes is over"),
    (batch(image_datum(None, targets=1), text_datum([1] * 22 + [100])), VISION, "datum 1: token id 100"),
])
def test_work_that_can_never_run_is_refused(request_: ForwardBackwardInput, rules: DatumRules, refusal: str) -> None:
    with pytest.raises(UserError, match=refusal):
        check_batch(request_, rules)


def test_an_image_without_a_declared_count_leaves_its_exact_checks_to_execution() -> None:
    """Its token count is known only once the image processor has seen it: the loss inputs' shapes wait."""
    check_batch(batch(image_datum(None, targets=1)), VISION)
    check_batch(batch(image_datum(4, targets=7)), VISION)  # declared: checked exactly, and it fits
    with pytest.raises(UserError, match="datum 0: 25 tokens exceed this server's limit of 24"):
        check_batch(batch(Datum(ModelInput((TextChunk((1,) * 20), ImageChunk(b"png", "png", 5),
                                            ImageChunk(b"png", "png", None))), {})), VISION)  # a lower bound


def test_a_batch_of_real_size_passes() -> None:
    tokens = np.random.default_rng(0).integers(0, 100, size=(8, 32))
    check_batch(batch(*[text_datum(t.tolist()) for t in tokens]), TEXT)
