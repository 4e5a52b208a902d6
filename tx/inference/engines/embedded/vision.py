"""Image prompts in the embedded engine: pixel inputs per request, multimodal positions per batch.

Design / who owns what:
- `prepare_vision` checks a request's images against its token ids (each image's span holds exactly its
  placeholder tokens, and no placeholder lies outside a span), decodes them and runs the model's image
  processor. It runs in the HTTP handler's worker thread, so a bad image fails that request alone. A prompt
  without images may hold placeholder tokens: they are text, as in Hugging Face's forward
  (docs/model-families.md#image-placeholder-tokens-in-text).
- `batch_vision` joins the prepared images of a left-padded batch into the model's inputs, and
  `rope_positions` computes the multimodal rotary positions (Qwen2-VL family `get_rope_index`) for the
  prefill. Decode steps then continue every row at `text position + rope delta` on the three rope axes.
"""

from __future__ import annotations

import binascii
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import torch

from tx.multimodal import AudioSpec, ImageLimits, VisionProcessor, audio_inputs, decode_image
from tx.types import UserError

if TYPE_CHECKING:
    from tx.inference.protocol import GenerateRequest


@dataclass
class PromptVision:
    """One request's images and audio clips, ready for the model."""

    pixel_values: torch.Tensor | None  # (patches, patch dim); None without images
    image_grid_thw: torch.Tensor | None  # (images, 3)
    spans: list[tuple[int, int]]  # (offset, num_tokens) of each image in the prompt
    audio: list[np.ndarray] = field(default_factory=list)  # each clip's levels (frames, bins), in prompt order


def prepare_vision(
    request: GenerateRequest, processor: VisionProcessor | None, limits: ImageLimits, audio: AudioSpec | None = None
) -> PromptVision | None:
    """The pixel inputs of `request`'s images and the levels of its clips (None without either); a UserError
    when they do not fit."""
    clips = prepare_audio(request, audio)
    images = _prepare_images(request, processor, limits)
    if images is None and not clips:
        return None
    if images is None:
        return PromptVision(None, None, [], clips)
    images.audio = clips
    return images


def prepare_audio(request: GenerateRequest, audio: AudioSpec | None) -> list[np.ndarray]:
    """The levels of `request`'s clips, each checked against the model's audio and its span of placeholders."""
    if not request.audio:
        return []
    if audio is None:
        raise UserError("this model takes no audio: the request holds audio clips")
    ids, end, clips = request.prompt_token_ids, 0, []
    for index, clip in enumerate(request.audio):
        try:
            levels = clip.levels()
            audio.check_levels(levels)
        except ValueError as exc:  # UserError is a ValueError too
            raise UserError(f"audio clip {index}: {exc}") from None
        span = ids[clip.offset : clip.offset + clip.frames]
        if clip.offset < end or len(span) != clip.frames or any(t != audio.token_id for t in span):
            raise UserError(f"audio clip {index}: its span does not hold {clip.frames} placeholder tokens")
        end = clip.offset + clip.frames
        clips.append(levels)
    if sum(1 for token in ids if token == audio.token_id) != sum(clip.frames for clip in request.audio):
        raise UserError(f"the prompt holds audio placeholder tokens ({audio.token_id}) outside its clips")
    return clips


def _prepare_images(
    request: GenerateRequest, processor: VisionProcessor | None, limits: ImageLimits
) -> PromptVision | None:
    if processor is None:
        if request.images:
            raise UserError("this model takes text only: the request holds images")
        return None
    if not request.images:
        return None
    _check_spans(request, processor.image_token_id)
    images, counts = [], []
    for index, image in enumerate(request.images):
        try:
            decoded = decode_image(image.image_bytes(), limits)
        except (binascii.Error, ValueError) as exc:
            raise UserError(f"image {index}: {exc}") from None
        made = processor.count_tokens(decoded)
        if made != image.num_tokens:
            raise UserError(f"image {index} makes {made} tokens, but its span has {image.num_tokens}")
        images.append(decoded)
        counts.append(made)
    inputs = processor.pixel_inputs(images, counts)
    spans = [(image.offset, image.num_tokens) for image in request.images]
    return PromptVision(inputs["pixel_values"], inputs["image_grid_thw"], spans)


def _check_spans(request: GenerateRequest, image_token_id: int) -> None:
    ids, end = request.prompt_token_ids, 0
    placeholders = sum(1 for token in ids if token == image_token_id)
    for index, image in enumerate(request.images):
        span = ids[image.offset : image.offset + image.num_tokens]
        if image.offset < end or len(span) != image.num_tokens or any(t != image_token_id for t in span):
            raise UserError(f"image {index}: its span does not hold {image.num_tokens} placeholder tokens")
        end = image.offset + image.num_tokens
    if placeholders != sum(image.num_tokens for image in request.images):
        raise UserError(
            f"the prompt holds image placeholder tokens ({image_token_id}) outside its images: beside images "
            "the model would take them for one of the images' placeholders (a prompt without images may hold "
            "them)"
        )


def batch_vision(visions: list[PromptVision | None], pads: list[int], width: int) -> dict[str, torch.Tensor]:
    """Model inputs of a left-padded batch: row i starts at column `pads[i]`. Audio: every clip's frames in row
    order, then prompt order (the placeholders' order in the flattened batch; `tx.multimodal.audio_inputs`)."""
    clips = [clip for v in visions if v is not None for clip in v.audio]
    inputs = audio_inputs(clips) if clips else {}
    if any(v is not None and v.pixel_values is not None for v in visions):
        inputs.update(_batch_images(visions, pads, width))
    return inputs


def _batch_images(visions: list[PromptVision | None], pads: list[int], width: int) -> dict[str, torch.Tensor]:
    pixels = [v.pixel_values for v in visions if v is not None and v.pixel_values is not None]
    grids = [v.image_grid_thw for v in visions if v is not None and v.image_grid_thw is not None]
    token_types = torch.zeros((len(visions), width), dtype=torch.long)
    for row, (vision, pad) in enumerate(zip(visions, pads)):
        for offset, num_tokens in vision.spans if vision is not None else ():
            token_types[row, pad + offset : pad + offset + num_tokens] = 1
    return {
        "pixel_values": torch.cat(pixels),
        "image_grid_thw": torch.cat(grids),
        "mm_token_type_ids": token_types,
    }


def rope_positions(
    model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, text_positions: torch.Tensor,
    inputs: dict[str, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor]:
    """(4, B, T) position ids (text positions, then the three rope axes) and each row's rope delta (B,)."""
    positions, deltas = _rope_indexer(model).get_rope_index(
        ids, mm_token_type_ids=inputs["mm_token_type_ids"], image_grid_thw=inputs["image_grid_thw"],
        attention_mask=mask,
    )
    return torch.cat([text_positions[None], positions]), deltas.reshape(-1)


@runtime_checkable
class _RopeIndexer(Protocol):
    """What a Qwen2-VL family model's inner model (its `.model`) computes multimodal rope positions with."""

    def get_rope_index(
        self, input_ids: torch.Tensor, mm_token_type_ids: torch.Tensor, *, image_grid_thw: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def _rope_indexer(model: torch.nn.Module) -> _RopeIndexer:
    """The inner model of `model` (PEFT's wrapper or the vision-language model itself) that has
    `get_rope_index`."""
    from peft import PeftModel

    core = model.get_base_model() if isinstance(model, PeftModel) else model
    inner = core.get_submodule("model")
    if not isinstance(inner, _RopeIndexer):
        raise TypeError(f"{type(core).__name__} has no multimodal rope positions (get_rope_index)")
    return inner


def step_positions(text_positions: torch.Tensor, deltas: torch.Tensor) -> torch.Tensor:
    """(4, B, 1) position ids of one decode step."""
    rope = text_positions + deltas
    return torch.stack([text_positions, rope, rope, rope])[:, :, None]
