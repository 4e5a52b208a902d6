"""A request's datums, validated, and a micro-batch of them laid out as the model's input tensors.

`prepare_data` checks every datum (images, tokens, loss inputs) before anything runs, so a bad datum fails
the request with a UserError that names it. The rules are `tx/backends/datums.py`'s, which the server also
applies when the request arrives; here they see the datum as the model does, images expanded.
`build_micro_batch` then lays some of those datums into rows (`plan.py`): packed end to end where the base
model keeps packed datums apart (`packing.py` checks it when it loads), else one per padded row.

The head works on flat positions, in datum order: datum 0's N_0 positions, then datum 1's, ... (N in all);
`index` says where each sits in the (rows x width) model input, `targets` is (N, K), K = the widest target (1
for targets of shape (N,)). The losses see one datum per row, as they expect (gspo averages over a row):
loss inputs and `mask` are (D, T, K) for D datums of at most T positions, and `scatter` says where each flat
position goes in the flattened (D x T). Entries outside `mask` hold target 0 and input 0.

Audio (dmel) chunks (models that take audio) become one placeholder token a frame; `vision` then also holds
`audio_input_ids`, every frame of the micro-batch's clips in placeholder order (`tx.multimodal.audio`).

Image chunks (vision-language models only) become the model's image placeholder tokens, as many as its image
processor makes of each image (`tx.multimodal`); `vision` then holds the micro-batch's pixel inputs and
`mm_token_type_ids` (1 at image positions). Image positions are ordinary positions for targets and outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tx.backends.datums import DatumRules, check_datum, check_not_empty, text_tokens
from tx.backends.losses import TARGET_KEY, LossFn
from tx.backends.torch.plan import RowLayout, pack_rows, pad_rows
from tx.multimodal import AudioSpec, ExpandedInput, ImageLimits, VisionProcessor, audio_inputs, expand_chunks
from tx.types import BaseModelInfo, Datum, ModelInput, UserError


@dataclass(frozen=True)
class PreparedDatum:
    """A validated datum: its model input with images expanded, and its loss inputs as arrays."""

    expanded: ExpandedInput
    arrays: dict[str, np.ndarray]  # TARGET_KEY -> int64 (N,) or (N, K); float inputs -> float32, same shape

    @property
    def num_tokens(self) -> int:
        return len(self.expanded.token_ids)


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # (R, L) int64
    position_ids: torch.Tensor | None  # (R, L) int64, restarting per datum; None for padded rows
    attention_mask: torch.Tensor | None  # (R, L) int64 for padded rows of unequal length; else None
    index: torch.Tensor  # (N,) int64: each flat position's place in the flattened (R * L) input
    targets: torch.Tensor  # (N, K) int64
    scatter: torch.Tensor  # (N,) int64: each flat position's place in the flattened (D * T) loss layout
    inputs: dict[str, torch.Tensor]  # name -> (D, T, K) float32
    mask: torch.Tensor  # (D, T, K) bool
    target_shapes: list[tuple[int, ...]]  # each datum's own target shape: (N_i,) or (N_i, K_i)
    vision: dict[str, torch.Tensor] = field(default_factory=dict)  # image inputs; empty without images

    @property
    def num_tokens(self) -> int:
        return int(self.index.shape[0])

    def to_rows(self, flat: torch.Tensor) -> torch.Tensor:
        """An (N, K) per-position tensor laid out (D, T, K), zero outside the datums (differentiable)."""
        rows = flat.new_zeros((self.mask.shape[0] * self.mask.shape[1], flat.shape[1]))
        return rows.index_copy(0, self.scatter, flat).view(self.mask.shape)

    def split_tensors(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Per-datum views of a (D, T, K) tensor (gradients flow through), each in its target shape."""
        return [
            row[: shape[0], : _width(shape)] if len(shape) == 2 else row[: shape[0], 0]
            for row, shape in zip(values, self.target_shapes, strict=True)
        ]

    def flat(self, rows: torch.Tensor) -> torch.Tensor:
        """A (D, T, K) per-datum tensor as (N, K) flat positions (the inverse of `to_rows` on the datums)."""
        return rows.flatten(0, 1).index_select(0, self.scatter)

    def split(self, values: torch.Tensor) -> list[np.ndarray]:
        """Per-datum float32 arrays of a (D, T, K) tensor, each in its datum's target shape."""
        array = values.detach().to("cpu", torch.float32).numpy()
        outputs = []
        for row, shape in zip(array, self.target_shapes, strict=True):
            piece = row[: shape[0], : _width(shape)]
            outputs.append(np.array(piece if len(shape) == 2 else piece[:, 0], dtype=np.float32))
        return outputs


def prepare_data(
    data: list[Datum],
    loss: LossFn,
    info: BaseModelInfo,
    vision: VisionProcessor | None = None,
    limits: ImageLimits = ImageLimits(),
    max_tokens: int | None = None,
    audio: AudioSpec | None = None,
) -> list[PreparedDatum]:
    """Validate every datum (images, audio, tokens, then loss inputs); UserError names the datum.

    `vision` is the model's image processor (None for a model without images, which refuses image chunks);
    `audio` what audio it takes (None: it refuses dmel chunks); `max_tokens` a cap on one datum's length below
    the model's context (None: the context)."""
    check_not_empty(data)
    rules = DatumRules(info, max_tokens, takes_images=vision is not None, image_limits=limits,
                       audio=audio)
    prepared = []
    for index, datum in enumerate(data):
        expanded = _expand(datum.model_input, vision, audio, limits, index)
        tokens = np.asarray(expanded.token_ids, dtype=np.int64)
        arrays = check_datum(datum, tokens, len(tokens), loss, rules, index)
        prepared.append(PreparedDatum(expanded, arrays))
    return prepared


def build_micro_batch(
    items: list[PreparedDatum], device: torch.device, vision: VisionProcessor | None = None, *,
    packed: bool,
) -> MicroBatch:
    """The model inputs of `items`: `packed` rows (with position ids restarting at every datum) when the
    base model keeps packed datums apart (`packing.py` checks it), else one datum per right-padded row.

    Vision-language models always get padded rows: their M-RoPE position ids are 3-D (text, then temporal,
    height, width) and computed by the model from a row's image grids (`get_rope_index`), so restarting
    them per datum would mean computing them ourselves for each datum; padded rows keep the model's own."""
    if packed and vision is not None:
        raise ValueError("a vision-language model's datums go in padded rows")
    # audio needs nothing of the rows: its positions are the text's, its frames go one per row (`audio_inputs`)
    lengths = [item.num_tokens for item in items]
    layout = pack_rows(lengths) if packed else pad_rows(lengths)
    input_ids, position_ids = _row_tensors(items, layout)
    index = np.concatenate(
        [seg.row * layout.width + seg.start + np.arange(seg.length) for seg in layout.segments]
    )
    targets, scatter = _flat_targets([item.arrays[TARGET_KEY] for item in items], max(lengths))
    inputs, mask = _row_inputs([item.arrays for item in items], max(lengths))
    unequal = min(lengths) != max(lengths)
    attention_mask = None
    if not packed and unequal:
        attention_mask = (np.arange(layout.width) < np.array(lengths)[:, None]).astype(np.int64)
    return MicroBatch(
        input_ids=_to(input_ids, device),
        position_ids=_to(position_ids, device) if packed else None,
        attention_mask=None if attention_mask is None else _to(attention_mask, device),
        index=_to(index, device),
        targets=_to(targets, device),
        scatter=_to(scatter, device),
        inputs={key: _to(value, device) for key, value in inputs.items()},
        mask=_to(mask, device),
        target_shapes=[item.arrays[TARGET_KEY].shape for item in items],
        vision={**_vision_inputs(items, layout, vision, device), **_audio_inputs(items, layout, device)},
    )


def text_items(token_lists: list[list[int]]) -> list[PreparedDatum]:
    """Datums of text alone with next-token targets (their last target is the first token): what a check of
    the model's own outputs needs (`packing.py`)."""
    return [
        PreparedDatum(ExpandedInput(tokens), {TARGET_KEY: np.roll(np.asarray(tokens, np.int64), -1)})
        for tokens in token_lists
    ]


def _row_tensors(items: list[PreparedDatum], layout: RowLayout) -> tuple[np.ndarray, np.ndarray]:
    """(R, L) input ids (0 in padding) and position ids restarting at 0 for every datum and every tail."""
    input_ids = np.zeros((layout.num_rows, layout.width), dtype=np.int64)
    position_ids = np.zeros((layout.num_rows, layout.width), dtype=np.int64)
    for seg in layout.segments:
        input_ids[seg.row, seg.start : seg.start + seg.length] = items[seg.datum].expanded.token_ids
        position_ids[seg.row, seg.start : seg.start + seg.length] = np.arange(seg.length)
    for row, start, length in layout.tails():
        position_ids[row, start : start + length] = np.arange(length)
    return input_ids, position_ids


def _flat_targets(targets: list[np.ndarray], longest: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, K) targets of every datum in order (0 past a datum's own K), and each row's place in (D x T)."""
    width = max(_width(t.shape) for t in targets)
    flat = np.zeros((sum(t.shape[0] for t in targets), width), dtype=np.int64)
    start = 0
    for t in targets:
        flat[start : start + t.shape[0], : _width(t.shape)] = t.reshape(t.shape[0], -1)
        start += t.shape[0]
    scatter = np.concatenate([d * longest + np.arange(t.shape[0]) for d, t in enumerate(targets)])
    return flat, scatter


def _row_inputs(
    arrays: list[dict[str, np.ndarray]], longest: int
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(D, T, K) float inputs and mask, one datum per row, zero-filled past each datum's own (N_i, K_i)."""
    width = max(_width(a[TARGET_KEY].shape) for a in arrays)
    keys = [key for key in arrays[0] if key != TARGET_KEY]
    rows = {key: np.zeros((len(arrays), longest, width), np.float32) for key in keys}
    mask = np.zeros((len(arrays), longest, width), dtype=bool)
    for d, datum_arrays in enumerate(arrays):
        num, cols = datum_arrays[TARGET_KEY].shape[0], _width(datum_arrays[TARGET_KEY].shape)
        mask[d, :num, :cols] = True
        for key in keys:
            rows[key][d, :num, :cols] = datum_arrays[key].reshape(num, cols)
    return rows, mask


def _expand(
    model_input: ModelInput, vision: VisionProcessor | None, audio: AudioSpec | None, limits: ImageLimits,
    index: int,
) -> ExpandedInput:
    if vision is None and audio is None:
        return ExpandedInput(text_tokens(model_input, index).tolist())
    try:
        return expand_chunks(model_input, vision, audio, limits)
    except UserError as exc:
        raise UserError(f"datum {index}: {exc}") from None


def _audio_inputs(items: list[PreparedDatum], layout: RowLayout, device: torch.device) -> dict[str, torch.Tensor]:
    """`audio_input_ids` of every clip in the rows, in the order of their placeholders in the flattened rows
    (packed rows may hold a later datum before an earlier one's tail)."""
    placed = [(seg.row * layout.width + seg.start + clip.offset, clip.levels)
              for seg in layout.segments for clip in items[seg.datum].expanded.audio]
    if not placed:
        return {}
    return audio_inputs([levels for _, levels in sorted(placed, key=lambda p: p[0])], device)


def _vision_inputs(
    items: list[PreparedDatum], layout: RowLayout, vision: VisionProcessor | None, device: torch.device
) -> dict[str, torch.Tensor]:
    """pixel_values and image_grid_thw of every image (datum order, then chunk order), mm_token_type_ids."""
    placed = [image for item in items for image in item.expanded.images]
    if not placed or vision is None:
        return {}
    inputs = vision.pixel_inputs([p.image for p in placed], [p.num_tokens for p in placed])
    token_types = np.zeros((layout.num_rows, layout.width), dtype=np.int64)
    for seg in layout.segments:
        token_types[seg.row, seg.start : seg.start + seg.length] = items[seg.datum].expanded.image_mask()
    inputs["mm_token_type_ids"] = torch.from_numpy(token_types)
    return {name: tensor.to(device) for name, tensor in inputs.items()}


def _width(shape: tuple[int, ...]) -> int:
    return shape[1] if len(shape) == 2 else 1


def _to(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(array).to(device)
