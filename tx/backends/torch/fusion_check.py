"""Whether a base model trains several runs in one pass exactly as alone, checked once per model at its first
fused pass: the families differ in where LoRA lands (attention, MLA, linear attention, fused MoE experts) and in
what each LoRA layer sees, so rather than trust a list, tx asks the model itself.

Throwaway adapters with random weights on every target run the same rows alone and stacked in one
`segments.segmented` pass; the final hidden states must agree: within 1e-4 of their scale in float32; in 16-bit,
where alone and stacked round differently and the rounding grows with depth (4e-2 on a random Qwen3-0.6B in
bfloat16 on a GPU), within a tenth of what a row through another run's adapter would be off by (and 0.1 at
most). A model that fails, or whose LoRA layers cannot be cut into the runs' blocks, trains its runs in turns,
with a warning in the log.
"""

from __future__ import annotations

import logging
import uuid

import numpy as np
import torch

from tx.backends.torch.batch import MicroBatch, build_micro_batch, text_items
from tx.backends.torch.fused import Rows
from tx.backends.torch.lora import AdapterHost
from tx.backends.torch.segments import Block, SegmentsUnsupported, lora_layers, segmented
from tx.multimodal import VisionProcessor
from tx.types import LoraConfig

logger = logging.getLogger(__name__)
LENGTHS = ((5, 7), (9,), (3, 4, 2))  # each throwaway run's datums: packed rows of unequal widths


def fuses_exactly(host: AdapterHost, device: torch.device, vision: VisionProcessor | None, name: str) -> bool:
    """Whether `host`'s model keeps each run's rows to its own adapter (module docstring)."""
    adapters = [f"chk_{uuid.uuid4().hex}" for _ in LENGTHS]  # as long as the runs' names: no name holds another
    try:
        for seed, adapter in enumerate(adapters):
            _randomize(host.add(adapter, LoraConfig(rank=2, seed=seed)).values(), seed)
        packed = host.packing != "padded"
        micros = [build_micro_batch(text_items(_tokens(lengths, seed)), device, vision, packed=packed)
                  for seed, lengths in enumerate(LENGTHS)]
        alone = [_alone(host, adapter, micro) for adapter, micro in zip(adapters, micros, strict=True)]
        error = _largest_gap(host, adapters, micros, alone)
        exact = next(host.model.parameters()).dtype == torch.float32
        bound = 1e-4 if exact else min(0.1, 0.1 * _misrouted_gap(host, adapters, micros, alone))
    except SegmentsUnsupported as exc:
        logger.warning("%s: runs train in turns, not in one pass: %s", name, exc)
        return False
    finally:
        for adapter in adapters:
            if adapter in host.peft_model.peft_config:
                host.remove(adapter)
    if error > bound:
        logger.warning("%s: runs train in turns, not in one pass: stacked rows differ from alone by %.3g (more "
                       "than %.3g)", name, error, bound)
        return False
    logger.info("%s: runs on it train together in one pass (stacked rows within %.2g of alone)", name, error)
    return True


def _alone(host: AdapterHost, adapter: str, micro: MicroBatch) -> torch.Tensor:
    """The final hidden states of `micro`'s real positions through `adapter` alone."""
    host.activate(adapter)
    with torch.no_grad():
        return _hidden(host, micro).flatten(0, 1).index_select(0, micro.index)


def _gap(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| relative to `want`'s scale (at least 1)."""
    return float((got.float() - want.float()).abs().max()) / max(1.0, float(want.abs().max()))


def _misrouted_gap(host: AdapterHost, adapters: list[str], micros: list[MicroBatch],
                   alone: list[torch.Tensor]) -> float:
    """The smallest gap a row gets through the next run's adapter instead of its own: what a fused pass that
    mixed up the runs' adapters would show."""
    shifted = adapters[1:] + adapters[:1]
    return min(_gap(_alone(host, other, micro), want) for other, micro, want in zip(shifted, micros, alone, strict=True))


def _largest_gap(host: AdapterHost, adapters: list[str], micros: list[MicroBatch], alone: list[torch.Tensor]) -> float:
    """max |stacked - alone| over the real positions, relative to the hidden states' scale."""
    with torch.no_grad():
        rows = Rows.of(micros)
        blocks = [Block(a, start, stop) for a, (start, stop) in zip(adapters, rows.spans, strict=True)]
        host.activate_many(adapters)
        unembedding = host.unembedding
        with segmented(lora_layers(host.peft_model, skip=unembedding), blocks, rows.count):
            stacked = host.hidden_states(rows.input_ids, position_ids=rows.position_ids,
                                         attention_mask=rows.attention_mask, vision=rows.vision)
    return max(_gap(stacked[block.start : block.stop, : micro.input_ids.shape[1]].flatten(0, 1)
                    .index_select(0, micro.index), want) for want, micro, block in zip(alone, micros, blocks, strict=True))


def _hidden(host: AdapterHost, micro: MicroBatch) -> torch.Tensor:
    return host.hidden_states(micro.input_ids, position_ids=micro.position_ids,
                              attention_mask=micro.attention_mask, vision=micro.vision)


def _tokens(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    """Low token ids (clear of a vision-language model's image placeholders), one list per datum."""
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 200, size=length).tolist() for length in lengths]


def _randomize(params, seed: int) -> None:
    """Every LoRA tensor random (a fresh adapter's B is zero: its rows would match any adapter's)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in params:
            param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
