"""A list of datums packed into right-padded tensors, so one forward pass serves the whole request.

Shapes: B datums, T = the longest datum's token count, K = the widest target (1 for targets of
shape (N,)). Targets and loss inputs are (B, T, K); `mask` marks the real (datum, position,
target) entries, and padding holds target 0 and input 0.

Image chunks (vision-language models only) become the model's image placeholder tokens, as many as its image
processor makes of each image (`tx.multimodal`); `vision` then holds the batch's pixel inputs and
`mm_token_type_ids` (1 at image positions). Image positions are ordinary positions for targets and outputs:
each gets a logprob like any other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tx.backends.losses import TARGET_KEY, LossFn
from tx.backends.torch.model import check_tokens
from tx.multimodal import ExpandedInput, ImageLimits, VisionProcessor
from tx.types import BaseModelInfo, Datum, ModelInput, UserError


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (B, T) int64
    attention_mask: torch.Tensor | None  # (B, T) int64; None when no datum is padded
    targets: torch.Tensor  # (B, T, K) int64
    inputs: dict[str, torch.Tensor]  # name -> (B, T, K) float32
    mask: torch.Tensor  # (B, T, K) bool
    target_shapes: list[tuple[int, ...]]  # each datum's own target shape: (N,) or (N, K)
    vision: dict[str, torch.Tensor] = field(default_factory=dict)  # image inputs; empty without images

    def split(self, values: torch.Tensor) -> list[np.ndarray]:
        """Per-datum float32 arrays of a (B, T, K) tensor, each in its datum's target shape."""
        array = values.detach().to("cpu", torch.float32).numpy()
        outputs = []
        for row, shape in zip(array, self.target_shapes, strict=True):
            piece = row[: shape[0], : _width(shape)]
            outputs.append(np.array(piece if len(shape) == 2 else piece[:, 0], dtype=np.float32))
        return outputs


def pack_batch(
    data: list[Datum],
    loss: LossFn,
    info: BaseModelInfo,
    device: torch.device,
    vision: VisionProcessor | None = None,
    limits: ImageLimits = ImageLimits(),
) -> PackedBatch:
    """Validate every datum (images, tokens, then loss inputs) and pack them; UserError names the datum.

    `vision` is the model's image processor (None for a text-only model, which refuses image chunks)."""
    if not data:
        raise UserError("forward_backward needs at least one datum")
    expanded = [_expand(datum.model_input, vision, limits, index) for index, datum in enumerate(data)]
    tokens = [item.token_ids for item in expanded]
    arrays = []
    for index, (datum, seq) in enumerate(zip(data, tokens)):
        check_tokens(seq, info, index)
        datum_arrays = loss.validate_datum(datum.loss_fn_inputs, len(seq), index, datum.loss_fn_input_spans)
        _check_targets(datum_arrays[TARGET_KEY], info, index)
        arrays.append(datum_arrays)
    lengths = np.array([len(seq) for seq in tokens])
    input_ids, packed, mask = _pad(tokens, arrays)
    padded = lengths.min() != lengths.max()
    attention_mask = (np.arange(lengths.max()) < lengths[:, None]).astype(np.int64) if padded else None
    return PackedBatch(
        input_ids=_to(input_ids, device),
        attention_mask=None if attention_mask is None else _to(attention_mask, device),
        targets=_to(packed.pop(TARGET_KEY), device),
        inputs={key: _to(value, device) for key, value in packed.items()},
        mask=_to(mask, device),
        target_shapes=[a[TARGET_KEY].shape for a in arrays],
        vision=_vision_inputs(expanded, vision, input_ids.shape, device),
    )


def _expand(
    model_input: ModelInput, vision: VisionProcessor | None, limits: ImageLimits, index: int
) -> ExpandedInput:
    try:
        if vision is None:
            return ExpandedInput(model_input.text_tokens())
        return vision.expand(model_input, limits)
    except UserError as exc:
        raise UserError(f"datum {index}: {exc}") from None


def _vision_inputs(
    expanded: list[ExpandedInput],
    vision: VisionProcessor | None,
    shape: tuple[int, ...],
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """pixel_values and image_grid_thw of every image (datum order, then chunk order), mm_token_type_ids."""
    placed = [image for item in expanded for image in item.images]
    if not placed or vision is None:
        return {}
    inputs = vision.pixel_inputs([p.image for p in placed], [p.num_tokens for p in placed])
    token_types = np.zeros(shape, dtype=np.int64)
    for row, item in enumerate(expanded):
        token_types[row, : len(item.token_ids)] = item.image_mask()
    inputs["mm_token_type_ids"] = torch.from_numpy(token_types)
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def _pad(
    tokens: list[list[int]], arrays: list[dict[str, np.ndarray]]
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """(B, T) input ids, (B, T, K) inputs and (B, T, K) mask, right-padded with zeros."""
    num_data, max_len = len(tokens), max(len(seq) for seq in tokens)
    width = max(_width(a[TARGET_KEY].shape) for a in arrays)
    input_ids = np.zeros((num_data, max_len), dtype=np.int64)
    mask = np.zeros((num_data, max_len, width), dtype=bool)
    packed = {key: np.zeros((num_data, max_len, width), value.dtype) for key, value in arrays[0].items()}
    for row, (seq, datum_arrays) in enumerate(zip(tokens, arrays)):
        input_ids[row, : len(seq)] = seq
        rows, cols = len(seq), _width(datum_arrays[TARGET_KEY].shape)
        mask[row, :rows, :cols] = True
        for key, value in datum_arrays.items():
            packed[key][row, :rows, :cols] = value.reshape(rows, cols)
    return input_ids, packed, mask


def _width(shape: tuple[int, ...]) -> int:
    return shape[1] if len(shape) == 2 else 1


def _to(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(array).to(device)


def _check_targets(targets: np.ndarray, info: BaseModelInfo, index: int) -> None:
    if targets.size and (targets.min() < 0 or targets.max() >= info.vocab_size):
        bad = targets.min() if targets.min() < 0 else targets.max()
        raise UserError(
            f"datum {index}: {TARGET_KEY!r} holds token id {bad}, "
            f"outside the vocabulary [0, {info.vocab_size})"
        )
