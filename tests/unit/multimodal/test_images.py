"""Decoding under caps, and image chunks expanded into the processor's placeholder tokens."""

from __future__ import annotations

import io

import pytest
from image_helpers import encode

from tx.multimodal import ImageLimits, decode_image, expand_input, vision_processor
from tx.types import ImageAssetPointer, ImageChunk, ModelInput, TextChunk, UserError

IMAGE_TOKEN = 2005


def test_decode_accepts_png_and_jpeg() -> None:
    assert decode_image(encode((1, 2, 3)), ImageLimits()).size == (64, 48)
    image = decode_image(encode((200, 10, 10), (32, 20), "JPEG"), ImageLimits())
    assert image.mode == "RGB" and image.size == (32, 20)


@pytest.mark.parametrize("data, reason", [
    (b"", "not a readable"),
    (b"not an image at all", "not a readable"),
    (encode((1, 2, 3))[:60], "corrupt"),
    (encode((1, 2, 3), fmt="GIF"), "not a readable"),
    (encode((1, 2, 3), fmt="BMP"), "not a readable"),
])
def test_decode_refuses_bad_data(data: bytes, reason: str) -> None:
    with pytest.raises(UserError, match=reason):
        decode_image(data, ImageLimits())


def test_decode_caps() -> None:
    data = encode((1, 2, 3), (100, 100))
    with pytest.raises(UserError, match=f"{len(data)} bytes is over this server's limit of 100 bytes"):
        decode_image(data, ImageLimits(max_bytes=100))
    with pytest.raises(UserError, match="100x100 = 10000 pixels is over this server's limit of 9999"):
        decode_image(data, ImageLimits(max_pixels=9999))


def test_pixel_cap_is_checked_before_decoding() -> None:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (5000, 5000)).save(buffer, format="PNG")  # ~25 KB of PNG, 25 M pixels
    assert len(buffer.getvalue()) < 100_000
    with pytest.raises(UserError, match="pixels is over"):
        decode_image(buffer.getvalue(), ImageLimits())
    buffer = io.BytesIO()
    Image.new("1", (20000, 20000)).save(buffer, format="PNG")  # 400 M pixels: PIL's own bomb guard
    with pytest.raises(UserError, match="too many pixels"):
        decode_image(buffer.getvalue(), ImageLimits(max_pixels=10**9))


@pytest.mark.parametrize("size, tokens", [((64, 48), 70), ((32, 32), 64), ((480, 360), 165), ((1, 1), 64)])
def test_token_counts_match_the_cookbook(vlm_dir, size, tokens: int) -> None:
    """docs/cookbook.md#images-and-their-token-counts: the client computes these with the Qwen3-VL processor settings."""
    processor = vision_processor(vlm_dir)
    assert processor.count_tokens(decode_image(encode((9, 9, 9), size), ImageLimits())) == tokens


def test_expand_splices_placeholders(vlm_dir) -> None:
    chunks = (TextChunk((1, 2, 2003)), ImageChunk(encode((5, 5, 5)), "png", 70), TextChunk((2004, 7)),
              ImageChunk(encode((6, 6, 6), (32, 32)), "png"))
    expanded = expand_input(vlm_dir, ModelInput(chunks))
    assert expanded.token_ids == [1, 2, 2003, *[IMAGE_TOKEN] * 70, 2004, 7, *[IMAGE_TOKEN] * 64]
    assert [(p.offset, p.num_tokens) for p in expanded.images] == [(3, 70), (75, 64)]
    assert expanded.image_mask() == [0, 0, 0, *[1] * 70, 0, 0, *[1] * 64]


def test_expand_refusals(vlm_dir, tmp_path) -> None:
    cases = {
        "expected_tokens is 69, but this model's image processor makes 70 tokens of this 64x48 image":
            (TextChunk((1,)), ImageChunk(encode((5, 5, 5)), "png", 69)),
        "holds the image placeholder token 2005 beside image chunks":
            (TextChunk((1, IMAGE_TOKEN)), ImageChunk(encode((5, 5, 5)), "png")),
        "only accepted in sampling": (ImageAssetPointer("/x.png", "png", 70),),
        "aspect ratio": (ImageChunk(encode((5, 5, 5), (1000, 4)), "png"),),
    }
    for reason, chunks in cases.items():
        with pytest.raises(UserError, match=reason):
            expand_input(vlm_dir, ModelInput(chunks))
    from tx.models.tiny import write_tiny_text_model

    text_dir = write_tiny_text_model(tmp_path / "text")
    with pytest.raises(UserError, match="takes text only"):
        expand_input(text_dir, ModelInput((ImageChunk(encode((5, 5, 5)), "png"),)))
    assert expand_input(text_dir, ModelInput.from_tokens([3, 4])).token_ids == [3, 4]


def test_placeholders_in_image_free_text_are_text(vlm_dir) -> None:
    """Hugging Face's forward takes them without images (issue 37: a policy sampled `<|image_pad|>`)."""
    chunks = (TextChunk((1, IMAGE_TOKEN)), TextChunk((IMAGE_TOKEN, 7)))
    expanded = expand_input(vlm_dir, ModelInput(chunks))
    assert expanded.token_ids == [1, IMAGE_TOKEN, IMAGE_TOKEN, 7] and expanded.images == ()
    assert expanded.image_mask() == [0, 0, 0, 0]
