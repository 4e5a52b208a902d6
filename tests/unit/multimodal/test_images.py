"""Decoding under caps, and image chunks expanded into the processor's placeholder tokens."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from image_helpers import encode

from tx.multimodal import ImageLimits, decode_image, expand_input, images_refused, vision_processor
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


def vlm_copy(vlm_dir: Path, into: Path) -> Path:
    """The tiny VLM's files in `into` (a directory of its own: processors are cached per directory)."""
    shutil.copytree(vlm_dir, into)
    return into


def test_processor_settings_in_transformers_5s_processor_config_are_read(vlm_dir, tmp_path) -> None:
    """transformers 5 saves a processor's settings in processor_config.json, under "image_processor"; a model saved
    that way took images as text-only (only preprocessor_config.json was looked for)."""
    model_dir = vlm_copy(vlm_dir, tmp_path / "saved-by-5")
    settings = json.loads((model_dir / "preprocessor_config.json").read_text())
    (model_dir / "preprocessor_config.json").unlink()
    (model_dir / "processor_config.json").write_text(json.dumps({"image_processor": settings}))
    expanded = expand_input(model_dir, ModelInput((ImageChunk(encode((5, 5, 5)), "png", 70),)))
    assert expanded.token_ids == [IMAGE_TOKEN] * 70


@pytest.mark.parametrize("settings, reason", [
    # transformers' Inkling processor exists only for torchvision (not importable beside CPU torch here); where
    # torchvision is installed it loads and fails the check below instead
    ({"image_processor_type": "InklingImageProcessor"}, "InklingImageProcessor"),
    # loads, but gives neither a token count per image nor image_grid_thw, which tx places images by
    ({"image_processor_type": "SiglipImageProcessor"}, "tx cannot place SiglipImageProcessor"),
])
def test_a_processor_tx_cannot_use_leaves_the_model_text_only_with_the_reason(
    vlm_dir, tmp_path, settings: dict[str, str], reason: str,
) -> None:
    """Decided at load, by loading the processor and checking its output on a probe image: such a model used to
    fail to load at all (the processor's ImportError/ValueError), text and audio included."""
    model_dir = vlm_copy(vlm_dir, tmp_path / "other-processor")
    (model_dir / "preprocessor_config.json").write_text(json.dumps(settings))
    assert vision_processor(model_dir) is None
    assert reason in (images_refused(model_dir) or "")
    with pytest.raises(UserError, match=f"takes no images on this server: .*{reason}"):
        expand_input(model_dir, ModelInput((TextChunk((1,)), ImageChunk(encode((5, 5, 5)), "png"))))
    assert expand_input(model_dir, ModelInput.from_tokens([3, 4])).token_ids == [3, 4]
    assert images_refused(vlm_dir) is None
