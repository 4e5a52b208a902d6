"""The torch trainer on a vision-language model: images in datums, a logprob at every position."""

from __future__ import annotations

import numpy as np
import pytest
from image_helpers import encode

from tx.types import (
    AdamParams,
    Datum,
    ForwardBackwardInput,
    ImageChunk,
    LoraConfig,
    ModelInput,
    TextChunk,
    UserError,
)


@pytest.fixture(scope="module")
def backend(vlm_dir):
    from tx.backends.torch.backend import TorchBackend
    from tx.multimodal import ImageLimits

    backend = TorchBackend({"vlm": vlm_dir}, device="cpu", image_limits=ImageLimits(max_pixels=50_000))
    backend.create_model("run", "vlm", LoraConfig(rank=8, seed=0))
    return backend


def datum(color, size=(64, 48), tokens: int = 70, prefix=(2001, 10, 2003), answer: int = 100) -> Datum:
    image = ImageChunk(encode(color, size), "png", tokens)
    chunks = (TextChunk(prefix), image, TextChunk((2004, 12, answer)))
    length = len(prefix) + tokens + 3
    targets = np.zeros(length, dtype=np.int64)
    weights = np.zeros(length, dtype=np.float32)
    targets[-2], weights[-2] = answer, 1.0
    return Datum(ModelInput(chunks), {"target_tokens": targets, "weights": weights})


def forward(backend, data, forward_only=True):
    batch = ForwardBackwardInput(data, "cross_entropy", forward_only=forward_only)
    return backend.forward_backward("run", batch)


def test_every_position_has_a_finite_logprob(backend) -> None:
    out = forward(backend, [datum((255, 0, 0))]).loss_fn_outputs[0]["logprobs"]
    assert out.shape == (3 + 70 + 3,) and out.dtype == np.float32 and np.isfinite(out).all()


def test_batched_datums_match_single_ones(backend) -> None:
    text_only = Datum(ModelInput.from_tokens([5, 6, 7, 8]), {"target_tokens": np.array([6, 7, 8, 9])})
    data = [datum((255, 0, 0)), datum((0, 0, 255), (32, 32), 64, prefix=(2001, 2003)), text_only]
    batched = forward(backend, data).loss_fn_outputs
    for item, together in zip(data, batched):
        alone = forward(backend, [item]).loss_fn_outputs[0]["logprobs"]
        np.testing.assert_allclose(together["logprobs"], alone, atol=1e-4)


def test_training_on_images_lowers_the_loss(backend) -> None:
    data = [datum((255, 0, 0), answer=100), datum((0, 0, 255), answer=200)]
    first = forward(backend, data, forward_only=False).metrics["loss:sum"]
    for _ in range(5):
        backend.optim_step("run", AdamParams(learning_rate=5e-3))
        loss = forward(backend, data, forward_only=False).metrics["loss:sum"]
    assert loss < 0.7 * first


def test_bad_images_name_the_datum(backend) -> None:
    cases = {
        "datum 1: chunk 1: image expected_tokens is 71": [datum((1, 1, 1)), datum((2, 2, 2), tokens=71)],
        "datum 0: chunk 1: image data is corrupt": [Datum(ModelInput((TextChunk((1,)), ImageChunk(
            encode((1, 1, 1))[:70], "png", 70))), {"target_tokens": np.zeros(71, dtype=np.int64)})],
        "over this server's limit of 50000": [datum((1, 1, 1), (300, 200), 90)],
    }
    for reason, data in cases.items():
        with pytest.raises(UserError, match=reason):
            forward(backend, data)
