"""Image makers for the multimodal tests."""

from __future__ import annotations

import io


def encode(color: tuple[int, int, int], size: tuple[int, int] = (64, 48), fmt: str = "PNG") -> bytes:
    """A solid-colour image of `size` (width, height), encoded as `fmt`."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format=fmt)
    return buffer.getvalue()


VISION_START, VISION_END = 2003, 2004  # the tiny vision-language models' <|vision_start|>, <|vision_end|>


def image_prompt(model_dir, prefix: list[int], color, size=(64, 48)):
    """An engine prompt: `prefix`, then one image of `color` between the vision markers, then three tokens.
    Returns (token ids with the image's placeholders, its `PromptImage`, its encoded bytes)."""
    import base64

    from tx.inference.protocol import PromptImage
    from tx.multimodal import ImageLimits, vision_processor
    from tx.types import ImageChunk, ModelInput, TextChunk

    data = encode(color, size)
    chunks = (TextChunk((*prefix, VISION_START)), ImageChunk(data, "png"), TextChunk((VISION_END, 40, 41)))
    expanded = vision_processor(model_dir).expand(ModelInput(chunks), ImageLimits())
    placed = expanded.images[0]
    image = PromptImage(data=base64.b64encode(data).decode(), format="png", offset=placed.offset,
                        num_tokens=placed.num_tokens)
    return expanded.token_ids, image, data
