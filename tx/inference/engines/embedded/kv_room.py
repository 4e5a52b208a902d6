"""KV cache layers with room to grow: a decode step writes its key and value into spare columns, where
transformers' `DynamicLayer` concatenates, copying every layer's whole cache on every step. That copy is
O(width) a step, so a generation's copying grows with the square of its length, and at real widths it is
a large share of a step: Qwen3-0.6B's shapes, 8 rows at 512 columns, ~17 MB a layer's keys in float32, 28
layers' keys and values copied each step.

`RoomyLayer` keeps `keys` and `values` as the leading columns of buffers with spare ones on the right (the
engine's rows are left-padded, so a row's new token always lands in the next column). When a step does not
fit, or when something else replaced `keys` or `values` (a reorder, a trim, a merge: they assign new
tensors), the layer moves into new buffers with room for a quarter of its width more (at least `MIN_ROOM`
columns): amortized, a few columns copied a step. The keys and values it hands out are the same numbers as
`DynamicLayer`'s; they are views, strided in the column dimension.

`give_room(cache)` turns a cache's plain growing layers (exactly `DynamicLayer`, as a prefill makes them for
softmax attention) into `RoomyLayer`s; sliding windows and linear-attention states keep their own classes.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

MIN_ROOM = 64
"""The fewest spare columns a move leaves (a quarter of the width when that is more)."""


class RoomyLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of buffers with spare columns (see the module)."""

    _buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # keys' and values' columns, spare ones included
    _views: tuple[torch.Tensor, torch.Tensor] | None = None  # what this layer last handed out as keys, values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        current = self.keys
        if not self.is_initialized or current is None or current.numel() == 0:
            return super().update(key_states, value_states, *args, **kwargs)
        width, new = current.shape[-2], key_states.shape[-2]
        keys, values = self._room_for(width + new)
        keys[..., width : width + new, :].copy_(key_states)
        values[..., width : width + new, :].copy_(value_states)
        self.keys, self.values = keys[..., : width + new, :], values[..., : width + new, :]
        self._views = (self.keys, self.values)
        return self.keys, self.values

    def _room_for(self, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The buffers, holding the current keys and values in their first columns and room up to `width`: this
        layer's own while `keys` and `values` are still the views it handed out and there is room, else new
        ones with a quarter of `width` (at least `MIN_ROOM`) spare."""
        views, buffers = self._views, self._buffers
        mine = views is not None and views[0] is self.keys and views[1] is self.values
        if mine and buffers is not None and buffers[0].shape[-2] >= width:
            return buffers
        columns = width + max(MIN_ROOM, width // 4)
        moved = []
        for current in (self.keys, self.values):
            assert current is not None
            buffer = current.new_empty((*current.shape[:-2], columns, current.shape[-1]))
            buffer[..., : current.shape[-2], :].copy_(current)
            moved.append(buffer)
        self._buffers = (moved[0], moved[1])
        return self._buffers


def give_room(cache: Any) -> None:
    """Make `cache`'s `DynamicLayer`s `RoomyLayer`s, keeping their state (others are left as they are)."""
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list):
        return
    for index, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            roomy = object.__new__(RoomyLayer)
            vars(roomy).update(vars(layer))
            layers[index] = roomy


__all__ = ["MIN_ROOM", "RoomyLayer", "give_room"]
