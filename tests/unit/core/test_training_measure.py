"""What a training call is charged and counted at submission (tx/core/training.py `measure`)."""

from __future__ import annotations

import numpy as np

from tx.core.training import measure
from tx.types import Datum, ForwardBackwardInput, ImageChunk, ModelInput, TextChunk


def image_datum(images: int) -> Datum:
    chunks = (TextChunk((1, 2)),) + tuple(ImageChunk(b"x" * 10, "png", expected_tokens=4) for _ in range(images))
    return Datum(ModelInput(chunks + (TextChunk((3,)),)), {"target_tokens": np.zeros(3 + 4 * images, np.int64)})


def test_the_images_quota_counts_one_datum_not_the_batch() -> None:
    """A VLM classifier's batch of 24 one-image datums counts 1 image against the per-prompt/datum quota (it was
    24, over the default 16: the classifier job got a 403)."""
    tokens, size, images = measure(ForwardBackwardInput([image_datum(1) for _ in range(24)], "cross_entropy"))
    assert images == 1
    assert tokens == 24 * (3 + 4) and size > 24 * 10
    assert measure(ForwardBackwardInput([image_datum(1), image_datum(3)], "cross_entropy"))[2] == 3
