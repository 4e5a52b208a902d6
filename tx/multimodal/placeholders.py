"""A vision-language model's placeholder tokens where they are text
(docs/model-families.md#image-placeholder-tokens-in-text).

- `placeholder_ids`: the image and video placeholder ids of a model's config; the engines never sample them.
- `text_placeholders_apart`: one forward over inputs with and without images. Hugging Face's forward counts
  every image placeholder id in `input_ids` against the image features it is given (and fails on a mismatch),
  while tx knows which positions are images (`mm_token_type_ids`). So a placeholder in the text of an input
  without images, sharing a forward (a trainer micro-batch, an engine prefill) with another input's images,
  is swapped for another id in the `input_ids` the model sees, and the input embedding still looks up the real
  id: each input gets the logprobs its own forward would.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_PLACEHOLDER_KEYS = ("image_token_id", "image_token_index", "video_token_id")


def placeholder_ids(config: Mapping[str, Any]) -> tuple[int, ...]:
    """The image, video and audio placeholder ids of a model's config.json (as a dict); () for a text-only
    model. An audio placeholder in text is refused (`AudioSpec.check_text`), so the engines never sample it."""
    keys = (_PLACEHOLDER_KEYS if "vision_config" in config else ()) + (
        ("audio_token_id",) if "audio_config" in config else ())
    return tuple(sorted({int(config[key]) for key in keys if config.get(key) is not None}))


@contextmanager
def text_placeholders_apart(
    model: torch.nn.Module, input_ids: torch.Tensor, vision: Mapping[str, torch.Tensor]
) -> Iterator[torch.Tensor]:
    """The input ids to hand `model`'s forward with `vision`'s image inputs (pixel_values, mm_token_type_ids):
    `input_ids` itself, unless some image placeholder ids lie outside the image positions; then a copy with
    those swapped for another id, while the input embedding looks up the real ids during the `with` block."""
    token = getattr(model.config, "image_token_id", None)
    types = vision.get("mm_token_type_ids")
    if token is None or types is None or "pixel_values" not in vision:
        yield input_ids
        return
    text = (input_ids == token) & (types != 1)
    if not bool(text.any()):
        yield input_ids
        return
    swapped = input_ids.masked_fill(text, 1 if token == 0 else 0)
    looked_up: list[bool] = []

    def real_ids(_module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        if not args or args[0] is not swapped:  # another forward of the same module (another thread's)
            return None
        looked_up.append(True)
        return (input_ids, *args[1:])

    handle = _input_embedding(model).register_forward_pre_hook(real_ids)
    try:
        yield swapped
    finally:
        handle.remove()
    if not looked_up:
        raise RuntimeError(f"{type(model).__name__}'s input embedding never saw the ids given to its forward")


def _input_embedding(model: torch.nn.Module) -> torch.nn.Module:
    """`model`'s input embedding (transformers' and PEFT's models name it with `get_input_embeddings`)."""
    import torch

    get = getattr(model, "get_input_embeddings", None)
    embedding = get() if callable(get) else None
    if not isinstance(embedding, torch.nn.Module):
        raise TypeError(f"{type(model).__name__} has no input embedding module (get_input_embeddings)")
    return embedding
