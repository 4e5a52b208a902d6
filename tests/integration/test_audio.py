"""Audio (DMel chunks) through the real SDK against a real `tx serve` on a tiny Inkling (8 mel bins, 16 levels):
training and forward see every frame as one placeholder position, the sampler's logprobs equal the trainer's,
bad clips, audio sent to a text-only model and an image beside a clip (the tiny Inkling takes no images) are 4xx
naming the chunk (docs/model-families.md#audio-in).

Clips are serialized as the SDK's TensorContainer bytes by `dmel` below; one test checks that the cookbook's
serializer (tml-renderers' native `_dmel_to_tensor_container_bytes`) makes the same bytes. The slow test shows
learning: SFT maps three synthetic clip patterns to their labels, and greedy samples of held-out clips are right.
"""

from __future__ import annotations

import importlib.util
import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
from dmel_bytes import tensor_container
from tinker import types
from txserver import TxServer

BINS, LEVELS, AUDIO_TOKEN = 8, 16, 2046
MAX_FRAMES = 64  # --audio-max-frames
MAX_BYTES = 2_000  # --audio-max-bytes
QUOTA_FRAMES = 48  # --quota-audio-frames-per-request (below the cap: a key may be held to less)


def clip(seed: int, frames: int = 6) -> types.DmelChunk:
    levels = np.random.default_rng(seed).integers(0, LEVELS, size=(frames, BINS))
    return types.DmelChunk(dmel=tensor_container(levels))


def audio_input(chunk: types.DmelChunk, before=(10, 11), after=(12, 13)) -> types.ModelInput:
    return types.ModelInput(chunks=[types.EncodedTextChunk(tokens=list(before)), chunk,
                                    types.EncodedTextChunk(tokens=list(after))])


def datum(model_input: types.ModelInput, targets: list[int] | None = None) -> types.Datum:
    length = model_input.length
    return types.Datum(model_input=model_input, loss_fn_inputs={
        "target_tokens": targets if targets is not None else [0] * length, "weights": [1.0] * length})


def next_token_datum(model_input: types.ModelInput) -> types.Datum:
    """Targets: the next position's id as the model sees it (AUDIO_TOKEN at every frame)."""
    ids: list[int] = []
    for chunk in model_input.chunks:
        ids += list(chunk.tokens) if isinstance(chunk, types.EncodedTextChunk) else [AUDIO_TOKEN] * chunk.length
    return datum(model_input, ids[1:] + [0])


def user_failure(future) -> str:
    """The message of a request refused as the user's: a 400 at submission or a future failed as "user"."""
    with pytest.raises((tinker.BadRequestError, tinker.RequestFailedError)) as info:
        future.result(timeout=120)
    if isinstance(info.value, tinker.RequestFailedError):
        assert info.value.category.value == "user"
    return str(info.value)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TxServer, str, str]]:
    from tx.models import write_tiny_model

    root = tmp_path_factory.mktemp("audio")
    inkling = write_tiny_model(root / "inkling", preset="inkling", seed=0)
    # Image processor settings, as a real Inkling checkpoint ships them: its processor is torchvision-only in
    # transformers, so here the model must serve text and audio and refuse images, not fail to load.
    (inkling / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "InklingImageProcessor"}))
    text = write_tiny_model(root / "text", preset="tiny", seed=0)
    args = ["--base-model", str(inkling), "--base-model", str(text), "--no-engine-colocate",
            "--audio-max-frames", str(MAX_FRAMES), "--audio-max-bytes", str(MAX_BYTES),
            "--quota-audio-frames-per-request", str(QUOTA_FRAMES)]
    with TxServer(root / "data", args=args, env={"OMP_NUM_THREADS": "1"}) as server:
        yield server, str(inkling), str(text)


@pytest.fixture(scope="module")
def client(served) -> Iterator[tinker.ServiceClient]:
    with served[0].client() as service:
        yield service


@pytest.fixture(scope="module")
def trainer(served, client) -> tinker.TrainingClient:
    return client.create_lora_training_client(served[1], rank=8, seed=0).result()


def logprobs(result) -> list[np.ndarray]:
    return [out["logprobs"].to_numpy() for out in result.loss_fn_outputs]


def test_every_frame_is_a_position_and_datums_keep_apart(trainer) -> None:
    inputs = [audio_input(clip(0, 6)), audio_input(clip(1, 9), before=(5,)),
              types.ModelInput.from_ints([20, 21, 22, 23]), audio_input(clip(2, 3))]
    data = [next_token_datum(model_input) for model_input in inputs]
    together = logprobs(trainer.forward(data, "cross_entropy").result())
    assert [len(x) for x in together] == [m.length for m in inputs] == [10, 12, 4, 7]
    for i, d in enumerate(data):  # each datum's logprobs are its own, whatever shares its pass
        alone = logprobs(trainer.forward([d], "cross_entropy").result())[0]
        np.testing.assert_allclose(together[i], alone, rtol=1e-5, atol=1e-5)
    other = logprobs(trainer.forward([next_token_datum(audio_input(clip(7, 6)))], "cross_entropy").result())[0]
    assert not np.allclose(other[2:8], together[0][2:8])  # the frames reach the model: another clip, other logprobs


def test_a_step_trains_on_audio(trainer) -> None:
    data = [next_token_datum(audio_input(clip(seed, 5))) for seed in range(4)]
    first = trainer.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    second = trainer.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    assert np.isfinite(first) and second < first


def bad_chunk(case: str) -> tuple[types.DmelChunk, str]:
    levels = np.random.default_rng(0).integers(0, LEVELS, size=(4, BINS))
    return {
        "bins": (types.DmelChunk(dmel=tensor_container(levels[:, :5])), "5 mel bins; this model takes 8"),
        "level": (types.DmelChunk(dmel=tensor_container(np.full((4, BINS), LEVELS))), "level 16"),
        "rank": (types.DmelChunk(dmel=tensor_container(levels.reshape(1, 4, BINS))), "rank 3"),
        "dtype": (types.DmelChunk(dmel=bytes([0]) + tensor_container(levels)[1:]), "dtype byte 0"),
        "truncated": (types.DmelChunk(dmel=tensor_container(levels)[:-3]), "bytes after its header"),
        "bytes": (types.DmelChunk(dmel=tensor_container(np.zeros((40, BINS), np.int64), 3)), f"cap of {MAX_BYTES}"),
    }[case]


def test_the_audio_quota_and_caps_bound_a_requests_frames(trainer, sampler) -> None:
    """Past the key's quota: a 403 naming the quota and its flag; past the server's cap: a 400 naming its flag."""
    over_quota = next_token_datum(audio_input(clip(0, QUOTA_FRAMES + 1)))
    for future in (trainer.forward([over_quota], "cross_entropy"),
                   sampler.sample(audio_input(clip(0, QUOTA_FRAMES + 1)), 1, types.SamplingParams(max_tokens=2))):
        with pytest.raises(tinker.PermissionDeniedError, match="--quota-audio-frames-per-request"):
            future.result(timeout=120)
    two = types.ModelInput(chunks=[*audio_input(clip(1, 40)).chunks, clip(2, 30)])  # 70 frames over two clips
    with pytest.raises(tinker.APIStatusError, match="70 audio frames|quota"):
        trainer.forward([next_token_datum(two)], "cross_entropy").result(timeout=120)


def test_every_datums_caps_come_before_any_clips_levels(trainer) -> None:
    """Issue 40: the caps of every clip of a request are read off their headers before any clip's values, so a
    later datum over --audio-max-bytes is the refusal, not an earlier datum's bad level (before, datum 0's levels
    were read, and widened, first)."""
    level, _ = bad_chunk("level")
    over, words = bad_chunk("bytes")  # 40 frames of int64: over the byte cap, under the frame quota
    data = [types.Datum(model_input=audio_input(chunk), loss_fn_inputs={
        "target_tokens": [0] * (chunk.length + 4), "weights": [1.0] * (chunk.length + 4)}) for chunk in (level, over)]
    message = user_failure(trainer.forward(data, "cross_entropy"))
    assert "datum 1" in message and words in message and "--audio-max-bytes" in message, message


@pytest.mark.parametrize("case", ["bins", "level", "rank", "dtype", "truncated", "bytes"])
def test_bad_clips_are_user_errors_naming_the_chunk(trainer, case: str) -> None:
    chunk, words = bad_chunk(case)
    good = next_token_datum(audio_input(clip(0)))
    bad = types.Datum(model_input=audio_input(chunk), loss_fn_inputs={
        "target_tokens": [0] * 8, "weights": [1.0] * 8})
    message = user_failure(trainer.forward([good, bad], "cross_entropy"))
    assert "datum 1" in message and words in message, message
    if case != "bytes":
        assert "chunk 1" in message, message


def test_audio_to_a_text_only_model_is_a_user_error(served, client) -> None:
    text_trainer = client.create_lora_training_client(served[2], rank=8, seed=0).result()
    message = user_failure(text_trainer.forward([next_token_datum(audio_input(clip(0)))], "cross_entropy"))
    assert "datum 0" in message and "audio" in message, message


def test_audio_placeholder_in_text_is_a_user_error(trainer) -> None:
    model_input = types.ModelInput.from_ints([10, AUDIO_TOKEN, 11])
    message = user_failure(trainer.forward([datum(model_input)], "cross_entropy"))
    assert str(AUDIO_TOKEN) in message and "dmel" in message, message


@pytest.mark.skipif(importlib.util.find_spec("tml_renderers") is None, reason="tml-renderers (dev extra)")
def test_the_cookbook_serializer_makes_the_same_bytes() -> None:
    import torch
    from tml_renderers.tinker import _dmel_to_tensor_container_bytes

    levels = np.random.default_rng(3).integers(0, LEVELS, size=(300, BINS))
    for dtype, byte in ((torch.uint8, 4), (torch.int32, 2), (torch.int64, 3)):
        made = _dmel_to_tensor_container_bytes(torch.from_numpy(levels).to(dtype))
        assert made == tensor_container(levels, byte)
        assert types.DmelChunk(dmel=made).length == 300


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sampler(trainer) -> tinker.SamplingClient:
    return trainer.save_weights_and_get_sampling_client().result()


def test_the_samplers_logprobs_are_the_trainers(trainer, sampler) -> None:
    model_input = audio_input(clip(11, 7), before=(30, 31, 32))
    prompt = sampler.compute_logprobs(model_input).result()
    assert len(prompt) == model_input.length == 12 and prompt[0] is None
    trained = logprobs(trainer.forward([next_token_datum(model_input)], "cross_entropy").result())[0]
    np.testing.assert_allclose(prompt[1:], trained[:-1], atol=1e-4)

    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)
    sequences = sampler.sample(model_input, 3, params).result().sequences
    assert len(sequences) == 3
    for seq in sequences:
        assert AUDIO_TOKEN not in seq.tokens  # a placeholder is never sampled
        full = types.ModelInput(chunks=[*model_input.chunks, types.EncodedTextChunk(tokens=list(seq.tokens))])
        mine = logprobs(trainer.forward([next_token_datum(full)], "cross_entropy").result())[0]
        np.testing.assert_allclose(seq.logprobs, mine[model_input.length - 1 : -1], atol=1e-4)


def test_mixed_prompts_sample_together(sampler) -> None:
    """Prompts with and without clips, of several lengths, in one batch of the engine: each its own answer."""
    inputs = [audio_input(clip(seed, 3 + seed)) for seed in range(3)] + [types.ModelInput.from_ints([40, 41])]
    alone = [sampler.compute_logprobs(m).result() for m in inputs]
    futures = [sampler.compute_logprobs(m) for m in inputs]
    for mine, future in zip(alone, futures, strict=True):
        np.testing.assert_allclose(mine[1:], future.result()[1:], atol=1e-4)


def test_bad_clips_in_a_prompt_are_user_errors(served, client, sampler) -> None:
    chunk, words = bad_chunk("bins")
    message = user_failure(sampler.sample(audio_input(chunk), 1, types.SamplingParams(max_tokens=2)))
    assert "chunk 1" in message and words in message, message
    chunk, words = bad_chunk("bytes")
    message = user_failure(sampler.sample(audio_input(chunk), 1, types.SamplingParams(max_tokens=2)))
    assert words in message, message
    text_sampler = client.create_sampling_client(base_model=served[2]).result()
    message = user_failure(text_sampler.sample(audio_input(clip(0)), 1, types.SamplingParams(max_tokens=2)))
    assert "audio" in message, message


def png() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), (200, 40, 40)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_an_image_beside_a_clip_is_a_user_error_naming_why(trainer, sampler) -> None:
    """Text, a clip and an image in one prompt: a 400 saying why the model takes no images here, in training and
    sampling. The tiny Inkling ships image processor settings, but transformers' Inkling image processor is
    torchvision-only (torchvision cannot be imported beside CPU torch here) and is not one tx can place images
    by (docs/model-families.md#where-lora-lands); the model still serves text and audio (the tests above)."""
    mixed = types.ModelInput(chunks=[*audio_input(clip(0, 4)).chunks,
                                     types.ImageChunk(data=png(), format="png", expected_tokens=4)])
    for future in (trainer.forward([datum(mixed)], "cross_entropy"),
                   sampler.sample(mixed, 1, types.SamplingParams(max_tokens=2))):
        message = user_failure(future)
        assert "takes no images on this server" in message and "InklingImageProcessor" in message, message


@pytest.fixture(scope="module", params=["auto", "always"])
def workers_trainer_server(request, served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """`served`'s tiny Inkling on a trainer of 2 worker processes (as the `workers_server` fixture runs them),
    the base held whole on each (auto, for a tiny base) or sharded over both with FSDP2 (always)."""
    args = ["--base-model", served[1], "--trainer-workers", "2", "--no-jwt-auth", "--no-engine-colocate",
            "--trainer-shard-base", request.param]
    with TxServer(tmp_path_factory.mktemp("audio-workers"), args=args, env={"OMP_NUM_THREADS": "1"}) as server:
        yield server


def test_trainer_workers_train_on_audio_as_the_in_process_trainer_does(served, client, workers_trainer_server) -> None:
    """Issue 40: clips cross the workers' message format (their TensorContainer bytes, no pickle) and the workers'
    steps and logprobs are the in-process trainer's."""
    data = [next_token_datum(audio_input(clip(seed, 4 + seed), before=(10 + seed,))) for seed in range(3)]
    data.append(next_token_datum(types.ModelInput.from_ints([20, 21, 22])))
    with workers_trainer_server.client() as workers_client:
        results = []
        for service in (client, workers_client):
            trainer = service.create_lora_training_client(served[1], rank=8, seed=5).result()
            losses = []
            for _ in range(2):
                losses.append(trainer.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
                trainer.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            results.append((losses, logprobs(trainer.forward(data, "cross_entropy").result())))
    (losses, in_process), (worker_losses, on_workers) = results
    np.testing.assert_allclose(worker_losses, losses, rtol=1e-4)
    assert losses[1] < losses[0]
    for mine, theirs in zip(in_process, on_workers, strict=True):
        np.testing.assert_allclose(theirs, mine, atol=1e-4)


LABELS = (100, 101, 102)  # one token per class
STEPS, LEARNING_RATE = 30, 5e-3
PATTERNS = np.array([[12, 12, 12, 12, 1, 1, 1, 1], [1, 1, 1, 1, 12, 12, 12, 12], [12, 1, 12, 1, 12, 1, 12, 1]])


def pattern_clip(label: int, rng: np.random.Generator, frames: int = 6) -> types.DmelChunk:
    """Class `label`'s mel pattern over every frame, each level jittered by up to +-2."""
    levels = PATTERNS[label][None, :] + rng.integers(-2, 3, size=(frames, BINS))
    return types.DmelChunk(dmel=tensor_container(np.clip(levels, 0, LEVELS - 1)))


def question(chunk: types.DmelChunk) -> types.ModelInput:
    return types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[10, 11]), chunk,
                                    types.EncodedTextChunk(tokens=[12])])


def labelled(chunk: types.DmelChunk, label: int) -> types.Datum:
    """SFT on the answer alone: the position after the question predicts the label token."""
    prompt = question(chunk)
    model_input = prompt.append(types.EncodedTextChunk(tokens=[LABELS[label]]))
    targets = [0] * model_input.length
    weights = [0.0] * model_input.length
    targets[prompt.length - 1], weights[prompt.length - 1] = LABELS[label], 1.0
    return types.Datum(model_input=model_input, loss_fn_inputs={"target_tokens": targets, "weights": weights})


@pytest.mark.slow
def test_a_tiny_inkling_learns_clip_patterns_to_labels(served, client) -> None:
    """Item 5 of issue 40: SFT through the SDK on synthetic clip patterns; the loss falls and the greedy label of
    held-out clips is right (chance: 1/3)."""
    rng = np.random.default_rng(0)
    train = [labelled(pattern_clip(label, rng), label) for _ in range(8) for label in range(3)]
    held_out = [(pattern_clip(label, rng), label) for _ in range(3) for label in range(3)]
    trainer = client.create_lora_training_client(served[1], rank=8, seed=1).result()
    losses = []
    for _ in range(STEPS):
        out = trainer.forward_backward(train, "cross_entropy").result()
        losses.append(out.metrics["loss:sum"] / len(train))
        trainer.optim_step(types.AdamParams(learning_rate=LEARNING_RATE)).result()
    assert losses[-1] < 0.2 * losses[0], losses
    sampler = trainer.save_weights_and_get_sampling_client().result()
    greedy = types.SamplingParams(max_tokens=1, temperature=0.0)
    futures = [(sampler.sample(question(chunk), 1, greedy), label) for chunk, label in held_out]
    got = [(future.result().sequences[0].tokens[0], LABELS[label]) for future, label in futures]
    assert all(sampled == wanted for sampled, wanted in got), (got, losses)

