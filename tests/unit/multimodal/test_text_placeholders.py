"""Image placeholder tokens in image-free text: the trainer and the embedded engine take them as Hugging
Face's plain forward does, also in a forward shared with another input's images; the engine never samples
them (docs/model-families.md#image-placeholder-tokens-in-text).

Issue 37: a policy sampled `<|image_pad|>`, and tx refused its own sampler's output in the next
forward_backward and in the next sample's prompt."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from image_helpers import encode, image_prompt

from tx.inference.engines.embedded import EmbeddedEngineConfig
from tx.inference.engines.embedded.engine import EmbeddedEngine
from tx.inference.engines.embedded.generate import Row, sample_next
from tx.inference.protocol import GenerateRequest
from tx.types import Datum, ForwardBackwardInput, ImageChunk, LoraConfig, ModelInput, TextChunk, UserError

PRESETS = ("vlm", "qwen3_5_vl", "qwen3_5_moe_vl")
VISION_START, VISION_END = 2003, 2004


@pytest.fixture(scope="module", params=PRESETS)
def preset_dir(request, tmp_path_factory):
    from tx.models.tiny_vlm import write_tiny_vlm

    return write_tiny_vlm(tmp_path_factory.mktemp(request.param), seed=0, preset=request.param)


def placeholder_ids(model_dir) -> tuple[int, int]:
    config = json.loads((model_dir / "config.json").read_text())
    return config["image_token_id"], config["video_token_id"]


def text_with_placeholders(model_dir) -> list[int]:
    image, video = placeholder_ids(model_dir)
    return [10, 11, image, 12, image, image, video, 13, VISION_START, image, VISION_END, 14]


def hf_logprobs(model_dir, ids: list[int]) -> np.ndarray:
    """Hugging Face's plain forward (no images): the logprob of each token after the first."""
    from tx.models.auto import load_pretrained

    model = load_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    return logprobs[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()


def next_token_datum(ids: list[int], chunks=None) -> Datum:
    model_input = ModelInput(chunks) if chunks else ModelInput.from_tokens(ids)
    targets = np.array([*ids[1:], 0])
    return Datum(model_input, {"target_tokens": targets, "weights": np.ones(len(ids), np.float32)})


@pytest.fixture(scope="module")
def backend(preset_dir):
    from tx.backends.torch.backend import TorchBackend

    backend = TorchBackend({"m": preset_dir}, device="cpu")
    backend.create_model("run", "m", LoraConfig(rank=8, seed=0))  # LoRA B = 0: the base model's logprobs
    return backend


def trainer_logprobs(backend, data: list[Datum]) -> list[np.ndarray]:
    out = backend.forward_backward("run", ForwardBackwardInput(data, "cross_entropy", forward_only=True))
    return [np.asarray(o["logprobs"]) for o in out.loss_fn_outputs]


@pytest.fixture(scope="module")
def engine(preset_dir, tmp_path_factory):
    config = EmbeddedEngineConfig(model_dir=preset_dir, cluster_secret="x" * 16, num_threads=1, device="cpu",
                                  stash_dir=tmp_path_factory.mktemp("stash"), batch_wait_s=0.2)
    engine = EmbeddedEngine(config)
    engine.start()
    yield engine
    engine.close()


def test_trainer_takes_placeholders_in_text_as_hf_does(backend, preset_dir) -> None:
    ids = text_with_placeholders(preset_dir)
    (logprobs,) = trainer_logprobs(backend, [next_token_datum(ids)])
    np.testing.assert_allclose(logprobs[:-1], hf_logprobs(preset_dir, ids), atol=1e-4)


def test_engine_takes_placeholders_in_text_as_hf_does(engine, preset_dir) -> None:
    ids = text_with_placeholders(preset_dir)
    request = GenerateRequest(prompt_token_ids=ids, max_tokens=1, prompt_logprobs=True)
    answer = engine.submit(request).result(120)
    assert answer.prompt_logprobs[0] is None
    np.testing.assert_allclose(answer.prompt_logprobs[1:], hf_logprobs(preset_dir, ids), atol=1e-4)


def test_a_trainer_forward_shared_with_images_keeps_each_datum_its_own(backend, preset_dir) -> None:
    """Hugging Face counts every placeholder of a forward against its image features; tx's own spans say which
    are images, so a text placeholder of one datum does not break another datum's images."""
    image = ImageChunk(encode((255, 0, 0)), "png", 70)
    image_chunks = (TextChunk((10, VISION_START)), image, TextChunk((VISION_END, 40, 41)))
    image_ids = [10, VISION_START, *[placeholder_ids(preset_dir)[0]] * 70, VISION_END, 40, 41]
    data = [next_token_datum(image_ids, image_chunks), next_token_datum(text_with_placeholders(preset_dir))]
    together = trainer_logprobs(backend, data)
    for shared, datum in zip(together, data):
        np.testing.assert_allclose(shared, trainer_logprobs(backend, [datum])[0], atol=1e-4)


def test_an_engine_prefill_shared_with_images_keeps_each_prompt_its_own(engine, preset_dir) -> None:
    image_ids, prompt_image, _ = image_prompt(preset_dir, [10, 11], (0, 0, 255))
    requests = [GenerateRequest(prompt_token_ids=image_ids, images=[prompt_image], max_tokens=1,
                                prompt_logprobs=True),
                GenerateRequest(prompt_token_ids=text_with_placeholders(preset_dir), max_tokens=1,
                                prompt_logprobs=True)]
    stats = engine.scheduler.stats
    before = stats.num_batches
    shared = [future.result(120) for future in [engine.submit(r) for r in requests]]
    assert stats.num_batches == before + 1  # one prefill for both (batch_wait_s)
    for request, answer in zip(requests, shared):
        single = engine.submit(request).result(120)
        np.testing.assert_allclose(answer.prompt_logprobs[1:], single.prompt_logprobs[1:], atol=1e-4)


def test_a_placeholder_in_text_beside_images_is_refused(backend, engine, preset_dir) -> None:
    image_token = placeholder_ids(preset_dir)[0]
    chunks = (TextChunk((10, image_token, VISION_START)), ImageChunk(encode((255, 0, 0)), "png", 70),
              TextChunk((VISION_END, 40)))
    with pytest.raises(UserError, match="beside image"):
        trainer_logprobs(backend, [next_token_datum([0] * 75, chunks)])
    ids, prompt_image, _ = image_prompt(preset_dir, [10, 11], (0, 0, 255))
    ids[1] = image_token
    with pytest.raises(UserError, match="beside image"):
        engine.submit(GenerateRequest(prompt_token_ids=ids, images=[prompt_image], max_tokens=1))


# ---- the embedded engine never samples a placeholder (masked in the draw; the logprob stays the model's)


def _rows(*settings: dict) -> list[Row]:
    requests = [GenerateRequest(prompt_token_ids=[1], seed=index, **kw) for index, kw in enumerate(settings)]
    return [Row.create(request, 0, eos_ids=()) for request in requests]


def test_no_row_draws_a_never_id_even_as_the_most_likely() -> None:
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    logits[:, [7, 8]] = 30.0  # ~all the mass
    raw = torch.log_softmax(logits, -1)
    for _ in range(50):
        rows = _rows({"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 100.0},
                     {"temperature": 1.0, "top_k": 1, "top_p": 0.5})
        tokens, logprobs, _ = sample_next(logits, rows, never=(7, 8))
        assert not {7, 8} & set(tokens)
        expected = raw[torch.arange(4), torch.tensor(tokens)].tolist()
        assert logprobs == pytest.approx(expected)  # the raw model's, not renormalised
    masked = logits.index_fill(1, torch.tensor([7, 8]), float("-inf"))
    assert [tokens[0], tokens[3]] == masked[[0, 3]].argmax(-1).tolist()  # greedy, top-1: the best of the rest
    assert set(sample_next(logits, _rows({"temperature": 0.0}))[0]) <= {7, 8}  # unmasked: the model's choice


def test_a_seeded_row_draws_the_same_with_an_empty_mask() -> None:
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    settings = ({"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9})
    assert sample_next(logits, _rows(*settings), never=()) == sample_next(logits, _rows(*settings))


def test_weights_name_a_vlms_placeholders_and_no_text_models(engine, preset_dir, tiny_model_dir) -> None:
    from tx.multimodal.placeholders import placeholder_ids as from_config

    assert engine.weights.never_sampled == tuple(sorted(placeholder_ids(preset_dir)))
    assert from_config(json.loads((tiny_model_dir / "config.json").read_text())) == ()


def test_the_engine_never_samples_a_placeholder_its_model_prefers(engine, preset_dir) -> None:
    """The head is hooked to put ~all the mass on the placeholders: the engine draws another token and reports
    the raw model's logprob of it (far below any renormalised one)."""
    never = placeholder_ids(preset_dir)
    head = engine.weights.model.get_output_embeddings()

    def prefer_placeholders(_module, _args, logits):
        logits[..., list(never)] += 1e4
        return logits

    handle = head.register_forward_hook(prefer_placeholders)
    try:
        for temperature in (0.0, 1.0, 50.0):
            request = GenerateRequest(prompt_token_ids=[10, 11, 12], n=4 if temperature else 1, max_tokens=1,
                                      temperature=temperature, seed=3, stop_at_eos=False)
            for sequence in engine.submit(request).result(120).sequences:
                assert sequence.token_ids[0] not in never
                assert sequence.logprobs[0] < -1000
    finally:
        handle.remove()
