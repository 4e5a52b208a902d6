"""The embedded engine samples from image prompts exactly as a plain transformers forward would."""

from __future__ import annotations

import pytest
import torch
from image_helpers import image_prompt

from tx.inference.engines.embedded import EmbeddedEngineConfig
from tx.inference.engines.embedded.engine import EmbeddedEngine
from tx.inference.protocol import GenerateRequest
from tx.multimodal import ImageLimits, vision_processor
from tx.types import UserError


@pytest.fixture(scope="module")
def engine(vlm_dir, tmp_path_factory):
    config = EmbeddedEngineConfig(model_dir=vlm_dir, cluster_secret="x" * 16, num_threads=1, device="cpu",
                                  stash_dir=tmp_path_factory.mktemp("stash"), batch_wait_s=0.05)
    engine = EmbeddedEngine(config)
    engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def reference(vlm_dir):
    from tx.models.auto import load_pretrained

    return load_pretrained(vlm_dir, dtype=torch.float32, attn_implementation="sdpa").eval()


def greedy_reference(model, vlm_dir, ids: list[int], data: bytes, steps: int):
    from tx.multimodal import decode_image

    processor = vision_processor(vlm_dir)
    image = decode_image(data, ImageLimits())
    pixels = processor.pixel_inputs([image], [processor.count_tokens(image)])
    ids, tokens, logprobs = list(ids), [], []
    with torch.no_grad():
        for _ in range(steps):
            x = torch.tensor([ids])
            token_types = (x == processor.image_token_id).long()
            logits = model(input_ids=x, mm_token_type_ids=token_types, **pixels).logits
            logp = torch.log_softmax(logits[0, -1], -1)
            token = int(logp.argmax())
            tokens.append(token)
            logprobs.append(float(logp[token]))
            ids.append(token)
    return tokens, logprobs


def test_batched_image_prompts_match_reference(engine, reference, vlm_dir):
    prompts = [image_prompt(vlm_dir, [10, 11, 12], (255, 0, 0)),
               image_prompt(vlm_dir, [30], (0, 0, 255), size=(32, 32))]
    futures = [
        engine.submit(GenerateRequest(prompt_token_ids=ids, images=[image], max_tokens=4, temperature=0,
                                      stop_at_eos=False, prompt_logprobs=True))
        for ids, image, _ in prompts
    ]
    text_only = engine.submit(GenerateRequest(prompt_token_ids=[5, 6, 7], max_tokens=4, temperature=0))
    for future, (ids, _, data) in zip(futures, prompts):
        answer = future.result(timeout=120)
        tokens, logprobs = greedy_reference(reference, vlm_dir, ids, data, 4)
        assert answer.sequences[0].token_ids == tokens
        assert answer.sequences[0].logprobs == pytest.approx(logprobs, abs=1e-4)
        values = answer.prompt_logprobs
        assert len(values) == len(ids) and values[0] is None
        assert all(isinstance(v, float) for v in values[1:])  # image positions included
    assert len(text_only.result(timeout=120).sequences[0].token_ids) >= 1


def test_image_requests_that_do_not_fit_are_refused(engine, vlm_dir):
    ids, image, _ = image_prompt(vlm_dir, [10], (0, 255, 0))
    bad = [
        GenerateRequest(prompt_token_ids=ids, images=[image.model_copy(update={"num_tokens": 69})]),
        GenerateRequest(prompt_token_ids=ids, images=[image.model_copy(update={"offset": 0})]),
        GenerateRequest(prompt_token_ids=[ids[0], *ids], images=[image]),  # the span moved: a placeholder outside
        GenerateRequest(prompt_token_ids=ids, images=[image.model_copy(update={"data": "bm90IGFuIGltYWdl"})]),
    ]
    for request in bad:
        with pytest.raises(UserError):
            engine.submit(request)
