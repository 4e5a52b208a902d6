"""A list of datums packed into right-padded tensors, so one forward pass serves the whole request.

Shapes: B datums, T = the longest datum's token count, K = the widest target (1 for targets of
shape (N,)). Targets and loss inputs are (B, T, K); `mask` marks the real (datum, position,
target) entries, and padding holds target 0 and input 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tx.backends.torch.losses import TARGET_KEY, LossFn
from tx.backends.torch.model import check_tokens
from tx.types import BaseModelInfo, Datum, UserError


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (B, T) int64
    attention_mask: torch.Tensor | None  # (B, T) int64; None when no datum is padded
    targets: torch.Tensor  # (B, T, K) int64
    inputs: dict[str, torch.Tensor]  # name -> (B, T, K) float32
    mask: torch.Tensor  # (B, T, K) bool
    target_shapes: list[tuple[int, ...]]  # each datum's own target shape: (N,) or (N, K)

    def split(self, values: torch.Tensor) -> list[np.ndarray]:
        """Per-datum float32 arrays of a (B, T, K) tensor, each in its datum's target shape."""
        array = values.detach().to("cpu", torch.float32).numpy()
        outputs = []
        for row, shape in zip(array, self.target_shapes, strict=True):
            piece = row[: shape[0], : _width(shape)]
            outputs.append(np.array(piece if len(shape) == 2 else piece[:, 0], dtype=np.float32))
        return outputs


def pack_batch(data: list[Datum], loss: LossFn, info: BaseModelInfo, device: torch.device) -> PackedBatch:
    """Validate every datum (tokens, then loss inputs) and pack them; UserError names the datum."""
    if not data:
        raise UserError("forward_backward needs at least one datum")
    tokens = [datum.model_input.text_tokens() for datum in data]
    arrays = []
    for index, (datum, seq) in enumerate(zip(data, tokens)):
        check_tokens(seq, info, index)
        datum_arrays = loss.validate_datum(datum.loss_fn_inputs, len(seq), index)
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
    )


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
