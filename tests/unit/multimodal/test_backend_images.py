"""The torch trainer on a vision-language model: images in datums, a logprob at every position."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from image_helpers import encode

from tx.optimizers import AdamParams
from tx.types import Datum, ForwardBackwardInput, ImageChunk, LoraConfig, ModelInput, TextChunk, UserError


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


def test_micro_batched_images_equal_one_pass(vlm_dir) -> None:
    """Image and text datums cut into micro-batches of 100 tokens (each image datum alone, in padded rows),
    logprobs 3 positions at a time, against one micro-batch with one chunk (the full logits)."""
    from tx.backends.torch import logprobs
    from tx.backends.torch.backend import TorchBackend
    from tx.config.sections import TrainerSection
    from tx.multimodal import ImageLimits

    text = [Datum(ModelInput.from_tokens(list(range(5, 5 + n))), {
        "target_tokens": np.arange(6, 6 + n), "weights": np.linspace(-1, 1, n, dtype=np.float32)}) for n in (9, 30)]
    data = [datum((255, 0, 0)), text[0], datum((0, 0, 255), (32, 32), 64, prefix=(2001, 2003)), text[1]]
    results = {}
    for name, budget, chunk in (("micro", 100, 3), ("one", 10_000, 1 << 30)):
        backend = TorchBackend({"vlm": vlm_dir}, device="cpu", image_limits=ImageLimits(max_pixels=50_000),
                               settings=TrainerSection(micro_batch_tokens=budget))
        backend.create_model("run", "vlm", LoraConfig(rank=4, seed=0))
        with torch.no_grad():
            for index, (_, tensor) in enumerate(backend.iter_trainable_weights("run")):
                tensor.copy_(torch.randn(tensor.shape, generator=torch.Generator().manual_seed(index)) * 0.05)
        vocab = backend._hosts["vlm"].vocab_size
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(logprobs, "CHUNK_LOGITS", chunk * vocab)
            out = forward(backend, data, forward_only=False)
        results[name] = (out, {n: g.clone() for n, g in backend.gradients("run").items()})
    (micro, micro_grads), (one, one_grads) = results["micro"], results["one"]
    for got, want in zip(micro.loss_fn_outputs, one.loss_fn_outputs):
        np.testing.assert_allclose(got["logprobs"], want["logprobs"], rtol=1e-5, atol=1e-5)
    assert micro.metrics["loss:sum"] == pytest.approx(one.metrics["loss:sum"], rel=1e-5, abs=1e-5)
    for name, want in one_grads.items():
        error, scale = float((micro_grads[name] - want).abs().max()), max(1.0, float(want.abs().max()))
        assert error <= 1e-5 * scale, f"{name}: {error} at scale {scale}"


def test_runs_with_images_in_one_pass_equal_each_alone(backend) -> None:
    """Padded rows with images (a vision-language model): two runs in one pass, each as alone (tx/backends/torch/
    fused.py stacks the rows, concatenates the images in row order and pads the token types)."""
    backend.create_model("other", "vlm", LoraConfig(rank=4, seed=1))
    backend.create_model("other-alone", "vlm", LoraConfig(rank=4, seed=1))
    text_only = Datum(ModelInput.from_tokens([5, 6, 7, 8]), {"target_tokens": np.array([6, 7, 8, 9]),
                                                            "weights": np.ones(4, np.float32)})
    mine = ForwardBackwardInput([datum((255, 0, 0)), text_only], "cross_entropy")
    theirs = ForwardBackwardInput([datum((0, 0, 255), (32, 32), 64, prefix=(2001, 2003))], "cross_entropy")
    try:
        together = backend.forward_backward_many([("run", mine), ("other", theirs)])
        assert backend._fusion == {"vlm": True}
        alone = backend.forward_backward("other-alone", theirs)
        assert not isinstance(together[1], Exception)
        np.testing.assert_allclose(together[1].loss_fn_outputs[0]["logprobs"],
                                   alone.loss_fn_outputs[0]["logprobs"], atol=1e-5)
        for name, grad in backend.gradients("other-alone").items():
            got = backend.gradients("other")[name]
            assert (grad is None) == (got is None)
            if grad is not None:
                torch.testing.assert_close(got, grad, atol=1e-5, rtol=1e-4, msg=name)
        first = together[0]
        assert not isinstance(first, Exception)
        want = forward(backend, [datum((255, 0, 0)), text_only]).loss_fn_outputs
        for got, w in zip(first.loss_fn_outputs, want):
            np.testing.assert_allclose(got["logprobs"], w["logprobs"], atol=1e-5)
    finally:
        for model_id in ("other", "other-alone"):
            backend.delete_model(model_id)
