"""The embedded engine's KV cache with room to grow (tx/inference/engines/embedded/kv_room.py): a decode step
writes into spare columns instead of copying every layer's cache, and the logits stay those of transformers'
own growing cache, bitwise, through joins, finished rows, trims and moves into bigger buffers, on the
transformers forward and the lean step alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from tx.inference.engines.embedded import generate
from tx.inference.engines.embedded.generate import DecodeBatch
from tx.inference.engines.embedded.kv_room import MIN_ROOM, RoomyLayer
from tx.inference.engines.embedded.weights import Weights

PROMPT = list(range(20, 36))
STEPS = MIN_ROOM + 20  # past the first buffers' room: at least one move


@pytest.fixture(scope="module")
def weights(tiny_model_dir: Path) -> Weights:
    return Weights(tiny_model_dir, max_adapters=1)


def _decode(weights: Weights, lean: bool) -> tuple[list[torch.Tensor], DecodeBatch]:
    """Logits of STEPS decode steps: a join before step 3, rows leaving (one repeated) before step 6, the
    longest row leaving (a trim) before step 30."""
    out = []
    with torch.inference_mode():
        model = weights.use([None])
        plan = weights.lean_plan(model) if lean else None
        assert not lean or plan is not None
        batch = DecodeBatch(weights.pad_id)
        batch.prefill(model, [PROMPT, PROMPT[:5], PROMPT[3:9]], 1)
        for i in range(STEPS):
            if i == 3:
                other = DecodeBatch(weights.pad_id)
                other.prefill(model, [PROMPT[:2], PROMPT[::2]], 1)
                batch.merge(other)
            if i == 6:
                batch.select_rows([0, 2, 2, 4])
            if i == 30:
                batch.select_rows([1, 2, 3])
            out.append(batch.step(model, [100 + 7 * i + r for r in range(batch.num_rows)], plan))
    return out, batch


@pytest.mark.parametrize("lean", [False, True], ids=["transformers forward", "lean step"])
def test_roomy_layers_give_the_growing_caches_logits_bitwise(weights, monkeypatch, lean):
    roomy, batch = _decode(weights, lean)
    assert all(type(layer) is RoomyLayer for layer in batch.cache.layers)
    monkeypatch.setattr(generate, "give_room", lambda cache: None)  # transformers' own DynamicLayer
    plain, batch = _decode(weights, lean)
    assert all(type(layer) is DynamicLayer for layer in batch.cache.layers)
    for step, (a, b) in enumerate(zip(roomy, plain, strict=True)):
        assert torch.equal(a, b), f"step {step}: {(a - b).abs().max()}"


def test_a_decode_step_writes_into_spare_columns_instead_of_copying_the_cache(weights):
    with torch.inference_mode():
        model = weights.use([None])
        batch = DecodeBatch(weights.pad_id)
        batch.prefill(model, [PROMPT, PROMPT[:5]], 1)
        batch.step(model, [1, 2])  # the first step moves the prefill's keys and values into buffers with room
        layer = batch.cache.layers[0]
        buffer = layer.keys.untyped_storage().data_ptr()
        room = layer._buffers[0].shape[-2] - layer.keys.shape[-2]
        assert room >= MIN_ROOM - 1
        for _ in range(room):
            batch.step(model, [1, 2])
            assert layer.keys.untyped_storage().data_ptr() == buffer  # no copy of the cache
        batch.step(model, [1, 2])  # full: one move into bigger buffers
        assert layer.keys.untyped_storage().data_ptr() != buffer
        assert layer.keys.shape[-2] == len(PROMPT) + room + 2
