"""Image makers for the multimodal tests."""

from __future__ import annotations

import io


def encode(color: tuple[int, int, int], size: tuple[int, int] = (64, 48), fmt: str = "PNG") -> bytes:
    """A solid-colour image of `size` (width, height), encoded as `fmt`."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format=fmt)
    return buffer.getvalue()
