"""Whether a base model's datums may share a row (packing), decided once by a self-check when it loads.

Packing several datums into one row is only correct when every layer keeps them apart. Softmax attention
does, given position ids that restart at each datum (transformers turns them into block-diagonal masks, or
varlen kernels for FlashAttention); layers that run across the whole row do not: Qwen3.5's gated delta net
(a causal convolution and a chunked scan) in transformers' torch path ignores sequence boundaries, and a
datum's logprobs then depend on its neighbours. So tx does not trust a list of names. When a base model is
first loaded, `choose_packing` runs a few random datums both packed and one per padded row, and takes the
first mode whose outputs match, logging its choice:

- "packed": position ids restarting at each datum; transformers derives the masks from them.
- "packed_masks": the same, plus the masks of each layer type built by tx from those position ids with
  transformers' own mask functions, for a model whose forward does not derive them itself (gpt-oss).
- "padded": one datum per right-padded row (causal layers never look right, so padding changes nothing).

Vision-language models always get padded rows: their multimodal rotary positions are computed by the model
per row from its image grids.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from transformers import PreTrainedModel

from tx.backends.torch.batch import build_micro_batch, text_items
from tx.models.agreement import difference, tolerance

logger = logging.getLogger(__name__)

PackingMode = Literal["packed", "packed_masks", "padded"]
PACKED_MODES: tuple[PackingMode, ...] = ("packed", "packed_masks")

CHECK_LENGTHS = (11, 5, 23, 7)
"""The self-check's datums: packed, rows of 23 are [23] and [11 + 7 + 5]; 23 is longer than a tiny sliding
window (16), so windows are checked too."""
CHECK_SEED = 0


def boundary_masks(
    model: PreTrainedModel, input_ids: torch.Tensor, position_ids: torch.Tensor
) -> dict[str, torch.Tensor | None]:
    """Each layer type's attention mask of a packed batch, from position ids restarting at every datum,
    built with transformers' own mask functions (keyed as the model's decoder layers look them up)."""
    from transformers.masking_utils import LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING

    config = model.config.get_text_config()
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    shape_only = torch.empty((*input_ids.shape, 0), dtype=model.dtype, device=input_ids.device)
    return {
        kind: LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING[kind](
            config=config, inputs_embeds=shape_only, attention_mask=None, past_key_values=None,
            position_ids=position_ids,
        )
        for kind in layer_types
    }


def choose_packing(model: PreTrainedModel, vision: bool, name: str) -> PackingMode:
    """The first of `PACKED_MODES` whose logprobs match padded rows on random datums, else "padded"."""
    if vision:
        logger.info("%s: padded rows (a vision-language model)", name)
        return "padded"
    reference = _check_logprobs(model, "padded")
    for mode in PACKED_MODES:
        try:
            packed = _check_logprobs(model, mode)
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:  # the model refuses this form
            logger.info("%s: %s rows refused (%s)", name, mode, exc)
            continue
        error = difference(packed, reference, model.dtype == torch.float32)
        if error <= tolerance(model.dtype):
            logger.info("%s: %s rows (packed vs padded differ by %.2g)", name, mode, error)
            return mode
        logger.info("%s: %s rows would mix datums (differ by %.3g from padded rows)", name, mode, error)
    logger.info("%s: padded rows (its layers do not keep packed datums apart)", name)
    return "padded"


def _check_logprobs(model: PreTrainedModel, mode: PackingMode) -> torch.Tensor:
    """(N, vocab) log-softmax at the real positions of the check's datums, laid out as `mode` says."""
    vocab = int(model.config.get_text_config().vocab_size)
    generator = torch.Generator().manual_seed(CHECK_SEED)
    tokens = [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in CHECK_LENGTHS]
    micro = build_micro_batch(text_items(tokens), model.device, packed=mode != "padded")
    mask = micro.attention_mask
    if mode == "packed_masks":
        assert micro.position_ids is not None, "packed rows have position ids"
        mask = boundary_masks(model, micro.input_ids, micro.position_ids)
    with torch.no_grad():
        logits = model(input_ids=micro.input_ids, position_ids=micro.position_ids, attention_mask=mask,
                       use_cache=False).logits
    return torch.log_softmax(logits.flatten(0, 1).index_select(0, micro.index).float(), dim=-1)

