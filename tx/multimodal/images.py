"""Decoding image bytes under caps: what every image a user sends goes through before a model sees it.

Only PNG and JPEG decoders are ever used (an image sent as "png" may hold JPEG bytes and vice versa: both
are accepted, nothing else is). The byte cap is checked before anything is parsed and the pixel cap on the
header, before the pixels are decoded, so a small file that would decode to a huge image (a "decompression
bomb") costs nothing.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tx.types import UserError

if TYPE_CHECKING:
    from PIL.Image import Image

_PIL_FORMATS = ("PNG", "JPEG")


@dataclass(frozen=True, kw_only=True)
class ImageLimits:
    """Caps on one image."""

    max_bytes: int = 20 << 20
    """Largest encoded image, in bytes."""
    max_pixels: int = 4096 * 4096
    """Largest decoded image, in pixels (width x height)."""

    def __post_init__(self) -> None:
        if self.max_bytes < 1 or self.max_pixels < 1:
            raise ValueError("image limits must be >= 1")


def check_image_size(data: bytes, limits: ImageLimits) -> None:
    """The byte cap, before anything is parsed (also checked when a training request arrives)."""
    if len(data) > limits.max_bytes:
        raise UserError(f"image of {len(data)} bytes is over this server's limit of {limits.max_bytes} bytes")


def decode_image(data: bytes, limits: ImageLimits) -> Image:
    """The RGB image encoded in `data`; a UserError if it is too large, corrupt, or not PNG/JPEG."""
    check_image_size(data, limits)
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            image = PILImage.open(io.BytesIO(data), formats=_PIL_FORMATS)
    except (PILImage.DecompressionBombWarning, PILImage.DecompressionBombError) as exc:
        raise UserError(f"image has too many pixels to decode: {exc}") from None
    except UnidentifiedImageError as exc:
        raise UserError(f"image data is not a readable PNG or JPEG image ({exc})") from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise UserError(f"image data is corrupt: {exc}") from None
    width, height = image.size
    if width * height > limits.max_pixels:
        raise UserError(
            f"image of {width}x{height} = {width * height} pixels is over this server's limit of "
            f"{limits.max_pixels} pixels"
        )
    try:
        image.load()
        return image.convert("RGB")
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise UserError(f"image data is corrupt: {exc}") from None
