"""Image chunks -> the model's processor -> placeholder tokens, spliced where each chunk stood.

A client sends text chunks and image chunks (the Qwen renderers put `<|vision_start|>` before an image and
`<|vision_end|>` after it, as text). The model's own image processor decides how many tokens an image is
(Qwen2-VL / Qwen2.5-VL / Qwen3-VL: smart resize, patches, `merge_size**2` patches per token); the chunk
becomes that many image placeholder tokens (`config.image_token_id`). A chunk whose `expected_tokens`
differs is a user error naming both numbers, so the client's lengths, targets and logprob arrays always
line up with the server's positions.

The placeholder token in a chunk's own text (a policy may sample `<|image_pad|>`) is text where the input has
no image: Hugging Face's forward checks placeholders only against the images it is given. Beside image chunks
it is refused: the model (and vLLM's processor) would count it as one of the images' placeholders
(docs/model-families.md#image-placeholder-tokens-in-text).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tx.multimodal.audio import AudioSpec, audio_spec
from tx.multimodal.images import ImageLimits, decode_image
from tx.types import (
    AudioChunk,
    ExpandedInput,
    ImageAssetPointer,
    ImageChunk,
    ModelInput,
    PlacedAudio,
    PlacedImage,
    TextChunk,
    UserError,
)

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image

PREPROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FILE = "processor_config.json"
logger = logging.getLogger(__name__)


class VisionProcessor:
    """A vision-language model's image processor and placeholder token."""

    def __init__(self, image_processor: Any, image_token_id: int) -> None:
        self.image_processor = image_processor
        self.image_token_id = image_token_id
        self.merge_size = int(getattr(image_processor, "merge_size", 1) or 1)

    @classmethod
    def load(cls, model_dir: Path) -> VisionProcessor | None:
        """The processor of the model in `model_dir`, or None for a text-only model; ImagesUnavailable when the
        model reads images but its processor cannot load here or fails `check`."""
        model_dir = Path(model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        if "vision_config" not in config or not has_image_processor(model_dir):
            return None
        from transformers import AutoImageProcessor

        image_token_id = config.get("image_token_id")
        if image_token_id is None:
            raise ValueError(f"{model_dir}/config.json has a vision_config but no image_token_id")
        try:
            image_processor = AutoImageProcessor.from_pretrained(str(model_dir))
        except (ImportError, OSError, ValueError) as exc:  # e.g. a processor that exists only for torchvision
            raise ImagesUnavailable(f"its image processor does not load here: {_first_line(exc)}") from None
        processor = cls(image_processor, int(image_token_id))
        processor.check()
        return processor

    def check(self) -> None:
        """ImagesUnavailable unless this processor gives what tx places images by: a token count per image
        (`get_number_of_image_patches`) that its pixel inputs' `image_grid_thw` agrees with, on a probe image
        (the Qwen-VL processors' interface; another family's would be placed wrong)."""
        from PIL import Image as PILImage

        probe = PILImage.new("RGB", (64, 48), (128, 64, 32))
        name = type(self.image_processor).__name__
        try:
            self.pixel_inputs([probe], [self.count_tokens(probe)])
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ImagesUnavailable(f"tx cannot place {name}'s images (its check at load failed: "
                                    f"{_first_line(exc)})") from None

    def count_tokens(self, image: Image) -> int:
        """How many placeholder tokens the model spends on `image`."""
        width, height = image.size
        try:
            patches = self.image_processor.get_number_of_image_patches(height, width, images_kwargs={})
        except ValueError as exc:  # e.g. an aspect ratio over 200
            raise UserError(f"this model cannot take a {width}x{height} image: {exc}") from None
        return int(patches) // self.merge_size**2

    def expand(self, model_input: ModelInput, limits: ImageLimits) -> ExpandedInput:
        """Token ids with placeholders for every image; a UserError for a bad image or token count."""
        return expand_chunks(model_input, self, None, limits)

    def check_text(self, tokens: Sequence[int]) -> None:
        """A UserError when text beside image chunks holds the placeholder token (the model could not tell it
        from an image's own)."""
        if self.image_token_id in tokens:
            raise UserError(
                f"text holds the image placeholder token {self.image_token_id} beside image chunks: the "
                "model would take it for one of the images' placeholders; send images as image chunks (text "
                "alone may hold it)"
            )

    def place(self, chunk: ImageChunk | ImageAssetPointer, offset: int, limits: ImageLimits) -> PlacedImage:
        if isinstance(chunk, ImageAssetPointer):
            raise UserError("image_asset_pointer chunks are only accepted in sampling requests")
        image = decode_image(chunk.data, limits)
        num_tokens = self.count_tokens(image)
        expected = chunk.expected_tokens
        if expected is not None and expected != num_tokens:
            width, height = image.size
            raise UserError(
                f"image expected_tokens is {expected}, but this model's image processor makes {num_tokens} "
                f"tokens of this {width}x{height} image"
            )
        return PlacedImage(image, chunk.data, chunk.format, offset, num_tokens)

    def pixel_inputs(self, images: Sequence[Image], counts: Sequence[int]) -> dict[str, torch.Tensor]:
        """`pixel_values` and `image_grid_thw` of `images`, in order; `counts` are their token counts."""
        out = self.image_processor(images=list(images), return_tensors="pt")
        grid = out["image_grid_thw"]
        made = (grid.prod(dim=-1) // self.merge_size**2).tolist()
        if made != list(counts):
            raise RuntimeError(f"the image processor made {made} tokens, its count said {list(counts)}")
        return {"pixel_values": out["pixel_values"], "image_grid_thw": grid}


def expand_chunks(
    model_input: ModelInput, vision: VisionProcessor | None, audio: AudioSpec | None, limits: ImageLimits,
    model_name: str = "this model",
) -> ExpandedInput:
    """Token ids with placeholders for every image (`vision`'s) and every audio frame (`audio`'s), in chunk
    order; a UserError naming the chunk for a bad chunk, or one the model does not take."""
    token_ids: list[int] = []
    images: list[PlacedImage] = []
    clips: list[PlacedAudio] = []
    for index, chunk in enumerate(model_input.chunks):
        try:
            if isinstance(chunk, TextChunk):
                _check_text(chunk.tokens, model_input, vision, audio)
                token_ids.extend(chunk.tokens)
            elif isinstance(chunk, AudioChunk):
                if audio is None:
                    raise UserError(f"{model_name} takes no audio: the input holds a dmel chunk")
                audio.check(chunk)
                clips.append(PlacedAudio(chunk.levels(), len(token_ids)))
                token_ids.extend([audio.token_id] * chunk.length)
            else:
                if vision is None:
                    raise UserError(f"{model_name} takes no images: the input holds an image chunk")
                images.append(vision.place(chunk, len(token_ids), limits))
                token_ids.extend([vision.image_token_id] * images[-1].num_tokens)
        except UserError as exc:
            raise UserError(f"chunk {index}: {exc}") from None
    return ExpandedInput(token_ids, tuple(images), tuple(clips))


def _check_text(
    tokens: Sequence[int], model_input: ModelInput, vision: VisionProcessor | None, audio: AudioSpec | None
) -> None:
    if vision is not None and model_input.has_images:
        vision.check_text(tokens)
    if audio is not None:  # always: a text-only datum may share a micro-batch with another's clips
        audio.check_text(tokens)


class ImagesUnavailable(Exception):
    """A vision-language model whose images this server cannot take: it serves text (and audio) only."""


def has_image_processor(model_dir: Path) -> bool:
    """Whether `model_dir` holds image processor settings: `preprocessor_config.json`, or transformers 5's
    `processor_config.json` with an `image_processor` entry."""
    if (model_dir / PREPROCESSOR_FILE).is_file():
        return True
    processor_file = model_dir / PROCESSOR_FILE
    return processor_file.is_file() and "image_processor" in json.loads(processor_file.read_text())


@functools.lru_cache(maxsize=32)
def _vision(model_dir: Path) -> tuple[VisionProcessor | None, str | None]:
    try:
        return VisionProcessor.load(model_dir), None
    except ImagesUnavailable as exc:
        logger.warning("%s reads images, but this server refuses them: %s", model_dir.name, exc)
        return None, str(exc)


def vision_processor(model_dir: Path) -> VisionProcessor | None:
    """`VisionProcessor.load`, once per model directory; None also where images are refused (`images_refused`)."""
    return _vision(Path(model_dir))[0]


def images_refused(model_dir: Path) -> str | None:
    """Why the vision-language model in `model_dir` takes no images on this server (None: it takes them, or it
    is not one): its image processor does not load here, or fails tx's check at load."""
    return _vision(Path(model_dir))[1]


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def expand_input(
    model_dir: Path, model_input: ModelInput, limits: ImageLimits = ImageLimits(), *, model_name: str = ""
) -> ExpandedInput:
    """`model_input` as token ids (with image placeholders) for the model in `model_dir`."""
    processor, audio = vision_processor(Path(model_dir)), audio_spec(Path(model_dir))
    if processor is None and model_input.has_images and (reason := images_refused(Path(model_dir))):
        raise UserError(f"model {model_name or str(model_dir)!r} takes no images on this server: {reason}")
    if processor is None and audio is None and model_input.has_images:
        name = model_name or str(model_dir)
        raise UserError(f"model {name!r} takes text only: the input holds image chunks")
    if processor is None and audio is None and model_input.has_audio:
        name = model_name or str(model_dir)
        raise UserError(f"model {name!r} takes text only: the input holds audio (dmel) chunks")
    if processor is None and audio is None:
        return ExpandedInput(model_input.text_tokens())
    return expand_chunks(model_input, processor, audio, limits, f"model {model_name or str(model_dir)!r}")
