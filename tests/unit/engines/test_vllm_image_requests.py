"""Image prompts in tx's vLLM engine without vLLM: the checks, the translation to `/inference/v1/generate`
(collapsed placeholders, data URLs, sampling params), the answer mapping, and the child's flags."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import pytest

from tx.inference.engines.vllm.child import VllmChild
from tx.inference.engines.vllm.config import VllmEngineConfig
from tx.inference.engines.vllm.images import (
    VisionModel,
    check_expansion,
    check_images,
    collapsed_prompt,
    content_parts,
    decode_images,
    vision_from_config,
)
from tx.inference.engines.vllm.translate import (
    completion_bodies,
    generate_response,
    tokens_answer,
    tokens_body,
)
from tx.inference.protocol import GenerateRequest, PromptImage
from tx.types import UserError

IMG = 2005  # the tiny tokenizer's <|image_pad|> (tx.models.tiny_files)
VISION = VisionModel(image_token_id=IMG)


def _png(color=(255, 0, 0), size=(32, 32)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def _image(offset: int, num_tokens: int, data: bytes | None = None, fmt: str = "png") -> PromptImage:
    data = _png() if data is None else data
    return PromptImage(data=base64.b64encode(data).decode("ascii"), format=fmt, offset=offset,
                       num_tokens=num_tokens)


def _request(**overrides) -> GenerateRequest:
    """[5, 6, img x3, 7, img x2, 8]: two images."""
    body = {
        "prompt_token_ids": [5, 6, IMG, IMG, IMG, 7, IMG, IMG, 8],
        "images": [_image(2, 3), _image(6, 2, _png((0, 0, 255)), "png")],
        "max_tokens": 4,
    }
    return GenerateRequest(**{**body, **overrides})


# ---- the model's vision facts


def test_vision_from_config_reads_the_image_token():
    assert vision_from_config({"model_type": "qwen3"}) is None
    assert vision_from_config({"vision_config": {}, "image_token_id": 151655}) == VisionModel(151655)
    assert vision_from_config({"vision_config": {}, "image_token_index": 32000}) == VisionModel(32000)
    with pytest.raises(ValueError, match="no image_token_id"):
        vision_from_config({"vision_config": {}})


def test_vision_model_load_from_a_model_dir(tmp_path):
    """The placeholder ids' text from the tokenizer: what vLLM's bad_words ban (images and videos alike)."""
    from tx.models.tiny_vlm import write_tiny_vlm

    model_dir = write_tiny_vlm(tmp_path / "vlm")
    assert VisionModel.load(model_dir) == VisionModel(2005, ("<|image_pad|>", "<|video_pad|>"))
    (model_dir / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    assert VisionModel.load(model_dir) is None


def test_a_placeholder_that_is_not_one_token_of_text_is_refused(tmp_path):
    from tx.models.tiny_vlm import write_tiny_vlm

    model_dir = write_tiny_vlm(tmp_path / "vlm")
    config = json.loads((model_dir / "config.json").read_text())
    for token in (94, 2013):  # a byte-level token whose text encodes to another id; no token at all
        (model_dir / "config.json").write_text(json.dumps({**config, "video_token_id": token}))
        with pytest.raises(ValueError, match=f"token {token} .* does not encode back to itself alone"):
            VisionModel.load(model_dir)


# ---- checks before vLLM


def test_a_valid_image_request_passes():
    check_images(_request(), VISION, max_images=2)
    check_images(GenerateRequest(prompt_token_ids=[1, 2]), None, max_images=1)  # text on a text model
    check_images(GenerateRequest(prompt_token_ids=[1, 2]), VISION, max_images=1)  # text on a VLM
    # placeholder tokens in a prompt without images are text (issue 37: a policy sampled one)
    check_images(GenerateRequest(prompt_token_ids=[1, IMG, 2, IMG]), VISION, max_images=1)


@pytest.mark.parametrize(
    ("vision", "request_", "max_images", "message"),
    [
        (None, _request(), 4, r"takes text only: the request holds 2 image\(s\)"),
        (VISION, _request(), 1, "holds 2 images; this engine takes at most 1 per prompt"),
        (VISION, _request(images=[_image(2, 3), _image(6, 3)]), 4, "image 1: its span does not hold 3"),
        (VISION, _request(images=[_image(1, 3), _image(6, 2)]), 4, "image 0: its span does not hold 3"),
        (VISION, _request(images=[_image(2, 3)]), 4, "placeholder tokens .2005. outside its images: beside"),
        (VISION, _request(images=[_image(6, 2), _image(2, 3)]), 4, "image 1: its span"),  # out of order
    ],
)
def test_bad_image_requests_are_user_errors(vision, request_, max_images, message):
    with pytest.raises(UserError, match=message):
        check_images(request_, vision, max_images)


def test_images_are_decoded_under_tx_caps():
    from tx.multimodal import ImageLimits

    decode_images(_request())
    with pytest.raises(UserError, match="image 0: image data is not a readable PNG or JPEG"):
        decode_images(_request(images=[_image(2, 3, b"not an image"), _image(6, 2)]))
    bad_base64 = _image(2, 3).model_copy(update={"data": "!!!"})
    with pytest.raises(UserError, match="image 0"):
        decode_images(_request(images=[bad_base64, _image(6, 2)]))
    with pytest.raises(UserError, match="image 1: image of 1024x1024"):
        decode_images(_request(images=[_image(2, 3), _image(6, 2, _png(size=(1024, 1024)))]),
                      ImageLimits(max_pixels=1000 * 1000))


# ---- translation


def test_each_image_span_collapses_to_one_placeholder():
    assert collapsed_prompt(_request(), IMG) == [5, 6, IMG, 7, IMG, 8]
    first = GenerateRequest(prompt_token_ids=[IMG, IMG, 3], images=[_image(0, 2)])
    assert collapsed_prompt(first, IMG) == [IMG, 3]
    last = GenerateRequest(prompt_token_ids=[3, IMG, IMG], images=[_image(1, 2)])
    assert collapsed_prompt(last, IMG) == [3, IMG]


def test_images_travel_as_data_urls_of_their_bytes():
    red = _png()
    images = [_image(0, 1, red), _image(2, 1, red, "jpeg")]
    request = GenerateRequest(prompt_token_ids=[IMG, 3, IMG], images=images)
    parts = content_parts(request)
    assert parts == [
        {"type": "image_url", "url": "data:image/png;base64," + base64.b64encode(red).decode("ascii")},
        {"type": "image_url", "url": "data:image/jpeg;base64," + base64.b64encode(red).decode("ascii")},
    ]
    json.dumps(parts)  # plain JSON: nothing pickled


def test_tokens_body_carries_the_completion_sampling_params():
    request = _request(n=3, seed=11, temperature=0.7, top_p=0.9, top_k=5, stop_token_ids=[8],
                       stop_strings=["x"], prompt_logprobs=True, topk_prompt_logprobs=2, stop_at_eos=False)
    bodies = completion_bodies(request, "tx-base")
    assert len(bodies) == 3  # seeded: one body per sample (seed + i)
    prompt, parts = collapsed_prompt(request, IMG), content_parts(request)
    out = [tokens_body(body, prompt, parts) for body in bodies]
    for i, body in enumerate(out):
        assert body["model"] == "tx-base" and body["token_ids"] == prompt and body["content_parts"] == parts
        assert body["return_token_ids"] is True and body["output_mode"] == "tokens"
        params = body["sampling_params"]
        assert params == {
            "n": 1, "seed": 11 + i, "max_tokens": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 5,
            "stop_token_ids": [8], "stop": ["x"], "include_stop_str_in_output": True, "ignore_eos": True,
            "logprobs": 0, "prompt_logprobs": 2 if i == 0 else None, "skip_special_tokens": False,
        }
    json.dumps(out)


def test_a_vlms_placeholders_are_banned_in_every_body():
    """Issue 37: the engines never sample a placeholder (vLLM's bad_words: -inf in the draw, after its raw
    logprobs); text-only and image prompts alike."""
    never = ("<|image_pad|>", "<|video_pad|>")
    text = GenerateRequest(prompt_token_ids=[1, 2], n=2, seed=3)
    assert all(body["bad_words"] == list(never) for body in completion_bodies(text, "tx-base", never=never))
    assert "bad_words" not in completion_bodies(text, "tx-base")[0]  # a text-only model: nothing banned
    (body,) = completion_bodies(_request(), "tx-base", never=never)
    assert tokens_body(body, [1], [])["sampling_params"]["bad_words"] == list(never)


def test_max_tokens_zero_asks_for_one_token():
    (body,) = completion_bodies(_request(max_tokens=0, prompt_logprobs=True), "tx-base")
    params = tokens_body(body, [1], [])["sampling_params"]
    assert params["max_tokens"] == 1 and params["prompt_logprobs"] == 0


def _tokens_answer(request: GenerateRequest, samples, prompt_rows=None, placeholders=None) -> dict:
    return {
        "request_id": "generate-tokens-1",
        "choices": [
            {"index": i, "finish_reason": reason, "token_ids": tokens,
             "logprobs": {"content": [{"token_id": t, "logprob": v, "rank": 1, "top_logprobs": []}
                                      for t, v in zip(tokens, values)]}}
            for i, (tokens, values, reason) in enumerate(samples)
        ],
        "prompt_logprobs": prompt_rows,
        "prompt_token_ids": request.prompt_token_ids,
        "mm_placeholders": placeholders
        if placeholders is not None
        else {"image": [{"offset": im.offset, "length": im.num_tokens} for im in request.images]},
    }


def test_tokens_answers_map_to_the_contract_response():
    request = _request(n=2, prompt_logprobs=True, topk_prompt_logprobs=1)
    prompt = request.prompt_token_ids
    rows = [None] + [{str(t): {"logprob": -0.5 * i, "rank": 1, "decoded_token": None}} for i, t in
                     enumerate(prompt[1:], start=1)]
    answer = _tokens_answer(request, [([3, 4], [-1.0, -2.0], "length"), ([8], [-0.25], "stop")], rows)
    check_expansion(request, answer)
    response = generate_response(request, [tokens_answer(answer)])
    assert [s.token_ids for s in response.sequences] == [[3, 4], [8]]
    assert [s.logprobs for s in response.sequences] == [[-1.0, -2.0], [-0.25]]
    assert [s.stop_reason for s in response.sequences] == ["length", "stop"]
    assert response.prompt_logprobs == [None] + [-0.5 * i for i in range(1, len(prompt))]
    assert response.topk_prompt_logprobs[1] == [(prompt[1], -0.5)]


def test_split_answers_keep_the_first_bodys_prompt_logprobs():
    request = _request(n=2, seed=3, prompt_logprobs=True)
    prompt = request.prompt_token_ids
    rows = [None] + [{str(t): {"logprob": -1.0, "rank": 1}} for t in prompt[1:]]
    answers = [
        tokens_answer(_tokens_answer(request, [([3], [-1.5], "length")], rows)),
        tokens_answer(_tokens_answer(request, [([4], [-2.5], "length")], None)),
    ]
    response = generate_response(request, answers)
    assert [s.token_ids for s in response.sequences] == [[3], [4]]
    assert response.prompt_logprobs[1:] == [-1.0] * (len(prompt) - 1)


def test_abort_keeps_partial_tokens():
    request = _request()
    answer = tokens_answer(_tokens_answer(request, [([3], [-1.0], "abort")]))
    (seq,) = generate_response(request, [answer]).sequences
    assert seq.stop_reason == "abort" and seq.token_ids == [3]


def test_another_expansion_than_the_requests_is_a_user_error():
    request = _request()
    other = {"image": [{"offset": 2, "length": 4}, {"offset": 7, "length": 2}]}
    with pytest.raises(UserError, match="image token counts differ"):
        check_expansion(request, _tokens_answer(request, [([3], [-1.0], "length")], placeholders=other))
    shifted = _tokens_answer(request, [([3], [-1.0], "length")])
    shifted["prompt_token_ids"] = [0] + request.prompt_token_ids[1:]
    with pytest.raises(UserError, match="other token ids"):
        check_expansion(request, shifted)


# ---- the engine: image prompts go to /inference/v1/generate, text keeps /v1/completions


class RecordingChild:
    served_name = "tx-base"

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    async def call(self, method, path, *, json_body=None, params=None, timeout=None):
        self.calls.append((path, json_body))
        if path == "/v1/completions":
            return {"choices": [{"index": 0, "finish_reason": "length", "token_ids": [3],
                                 "logprobs": {"token_logprobs": [-1.0]}}]}
        prompt = _request().prompt_token_ids
        return {"choices": [{"index": 0, "finish_reason": "length", "token_ids": [3],
                             "logprobs": {"content": [{"token_id": 3, "logprob": -1.0}]}}],
                "prompt_token_ids": prompt,
                "mm_placeholders": {"image": [{"offset": 2, "length": 3}, {"offset": 6, "length": 2}]}}


def _engine(tmp_path, vision: bool, **config):
    from tx.inference.engines.vllm.server import VllmEngine

    from tx.models.tiny_files import write_tokenizer

    model = {"vision_config": {}, "image_token_id": IMG} if vision else {"model_type": "qwen3"}
    (tmp_path / "config.json").write_text(json.dumps(model))
    if vision:
        write_tokenizer(tmp_path)  # the placeholder's text, for vLLM's bad_words
    cfg = VllmEngineConfig(model_dir=tmp_path, cluster_secret="secret-for-tests", **config)
    child = RecordingChild()
    return VllmEngine(cfg, child, tmp_path), child


def test_engine_routes_image_prompts_to_the_tokens_api(tmp_path):
    engine, child = _engine(tmp_path, vision=True)
    response = asyncio.run(engine.generate(_request(max_tokens=1)))
    assert response.sequences[0].token_ids == [3]
    ((path, body),) = child.calls
    assert path == "/inference/v1/generate"
    assert body["token_ids"] == [5, 6, IMG, 7, IMG, 8] and len(body["content_parts"]) == 2
    assert body["sampling_params"]["bad_words"] == ["<|image_pad|>"]  # never sampled (issue 37)

    text = asyncio.run(engine.generate(GenerateRequest(prompt_token_ids=[5, IMG, 6], max_tokens=1)))
    assert text.sequences[0].token_ids == [3]
    assert child.calls[-1][0] == "/v1/completions" and child.calls[-1][1]["prompt"] == [5, IMG, 6]
    assert child.calls[-1][1]["bad_words"] == ["<|image_pad|>"]


def test_engine_refuses_too_many_images_before_vllm(tmp_path):
    engine, child = _engine(tmp_path, vision=True, max_images_per_prompt=1)
    with pytest.raises(UserError, match="at most 1 per prompt"):
        asyncio.run(engine.generate(_request()))
    assert child.calls == []


def test_engine_without_lora_refuses_adapters(tmp_path):
    from tx.inference.protocol import LoraSpec

    engine, child = _engine(tmp_path, vision=True, enable_lora=False)
    with pytest.raises(UserError, match="without LoRA"):
        lora = LoraSpec(r=4, lora_alpha=8, target_modules=["q_proj"])
        asyncio.run(engine._update_adapter("a", lora, "m", "{}"))
    assert child.calls == []


# ---- the child's flags


def _command(tmp_path, vision: bool, **config) -> list[str]:
    model = {"vision_config": {}, "image_token_id": IMG} if vision else {"model_type": "qwen3"}
    (tmp_path / "config.json").write_text(json.dumps(model))
    cfg = VllmEngineConfig(model_dir=tmp_path, cluster_secret="secret-for-tests", **config)
    return VllmChild(cfg, tmp_path, "tx-base", sleep_mode=False).command()


def test_child_enables_the_tokens_api_only_for_vision_models(tmp_path):
    text = _command(tmp_path, vision=False)
    assert "--enable-scale-out" not in text and "--limit-mm-per-prompt" not in text
    assert "--enable-lora" in text
    vlm = _command(tmp_path, vision=True, max_images_per_prompt=3)
    assert "--enable-scale-out" in vlm
    assert json.loads(vlm[vlm.index("--limit-mm-per-prompt") + 1]) == {"image": 3, "video": 0}
    no_lora = _command(tmp_path, vision=True, enable_lora=False)
    assert not any(arg.startswith("--enable-lora") or "lora" in arg for arg in no_lora)
