"""The embedded engine's attention: the trainer's choice for the family (`tx/models/attention.py`), with SDPA
run as `gqa_sdpa` (the same math, without copying grouped key/value heads on cpu), unless the engine's
self-check finds the family's code branching on the implementation's name (`selfcheck.py`)."""

from __future__ import annotations

from pathlib import Path

import torch

from tx.config.names import AttnImplementation
from tx.models.attention import choose_attention

_GQA_SDPA = "tx_gqa_sdpa"


def family_attention(model_dir: Path, device: torch.device, dtype: torch.dtype,
                     forced: AttnImplementation | None) -> AttnImplementation:
    """The implementation the trainer runs the family with (`tx/models/attention.py`)."""
    half = dtype in (torch.bfloat16, torch.float16)
    return choose_attention(model_dir, device.type, half, forced)


def engine_attention(family: AttnImplementation) -> str:
    """The implementation to load the engine's model with, given the family's: SDPA runs as `gqa_sdpa`. The
    engine's self-check (`selfcheck.py`) goes back to the family's own where the two differ."""
    return gqa_sdpa() if family == "sdpa" else family


def gqa_sdpa() -> str:
    """transformers' sdpa attention, except that grouped-query attention with a mask passes `enable_gqa`
    to SDPA instead of copying every KV head `num_key_value_groups` times (transformers only does that
    without a mask; on cpu the copy is most of a decode step's attention time). The same math: SDPA with
    `enable_gqa` gives bit-identical outputs here. Anything else goes to transformers' own function."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import sdpa_mask

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
        groups = getattr(module, "num_key_value_groups", 1)
        plain = not kw.get("output_attentions") and kw.get("position_bias") is None and kw.get("cache") is None
        if groups == 1 or attention_mask is None or query.device.type != "cpu" or not plain:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, is_causal=is_causal, **kw)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, enable_gqa=True
        )
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register(_GQA_SDPA, forward)
    AttentionMaskInterface.register(_GQA_SDPA, sdpa_mask)
    return _GQA_SDPA
