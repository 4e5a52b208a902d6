"""Tiny random vision-language models (Qwen3-VL dense and MoE, Qwen3.5 dense and MoE), written like a hub snapshot.

The image processor config is the one the tinker-cookbook computes its `expected_tokens` with for Qwen3-VL
(docs/cookbook.md#images-and-their-token-counts): patch 16, merge 2, temporal patch 2, at least 65536
pixels after resizing, mean/std 0.5. So a 64x48 image is 70 tokens, 32x32 is 64 and 480x360 is 165, on the
client and on the server.

Qwen3-VL's language model has the shape of the text "tiny" preset (hidden 64, head_dim 32,
`initializer_range=0.1`); Qwen3.5's is the tiny text family of `tiny_families.py` (a linear-attention layer,
then a full-attention one). The vision tower is 2 blocks of width 64 with head size 32, and no deepstack
layers (docs/tiny-models.md#vision-language-models). Qwen3.5 and Qwen3.6 use Qwen3-VL's image processing
(the cookbook's renderer for them says so), so the same `PREPROCESSOR_CONFIG` serves all three.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from tx.models.tiny import PRESETS
from tx.models.tiny_families import linear_attention_fields, moe_fields
from tx.models.tiny_files import special_ids, write_model, write_tokenizer

if TYPE_CHECKING:
    from transformers import PretrainedConfig


VLM_PRESET = "vlm"
IMAGE_TOKEN = "<|image_pad|>"
VIDEO_TOKEN = "<|video_pad|>"
VISION_START_TOKEN = "<|vision_start|>"
VISION_END_TOKEN = "<|vision_end|>"

PREPROCESSOR_CONFIG: dict[str, Any] = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "patch_size": 16,
    "merge_size": 2,
    "temporal_patch_size": 2,
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": True,
}
"""Qwen3-VL's image processing (the cookbook's offline kit); transformers loads it as the PIL processor
when torchvision is absent."""

_VISION = {
    "depth": 2,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_heads": 2,
    "patch_size": PREPROCESSOR_CONFIG["patch_size"],
    "spatial_merge_size": PREPROCESSOR_CONFIG["merge_size"],
    "temporal_patch_size": PREPROCESSOR_CONFIG["temporal_patch_size"],
    "num_position_embeddings": 64,
    "deepstack_visual_indexes": [],
}


def _mrope_section(head_dim: int) -> list[int]:
    """Text, height and width shares of the rotary half-dimensions (summing to head_dim / 2)."""
    half = head_dim // 2
    return [half - 2 * (half // 3), half // 3, half // 3]


def _text_fields(ids: dict[str, int]) -> dict[str, Any]:
    text = PRESETS["tiny"]
    return {
        "vocab_size": text.vocab_size,
        "hidden_size": text.hidden_size,
        "num_attention_heads": text.num_attention_heads,
        "num_key_value_heads": text.num_key_value_heads,
        "head_dim": text.head_dim,
        "max_position_embeddings": 4096,
        "initializer_range": text.initializer_range,
        "tie_word_embeddings": False,
        **special_ids(ids),
    }


def _token_fields(ids: dict[str, int]) -> dict[str, Any]:
    return {
        "image_token_id": ids[IMAGE_TOKEN],
        "video_token_id": ids[VIDEO_TOKEN],
        "vision_start_token_id": ids[VISION_START_TOKEN],
        "vision_end_token_id": ids[VISION_END_TOKEN],
        "tie_word_embeddings": False,
    }


def qwen3_vl(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import Qwen3VLConfig

    text = PRESETS["tiny"]
    rope = {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": _mrope_section(text.head_dim),
            "mrope_interleaved": True}
    return Qwen3VLConfig(
        text_config={**_text_fields(ids), "intermediate_size": text.intermediate_size,
                     "num_hidden_layers": text.num_hidden_layers, "rope_parameters": rope},
        vision_config={**_VISION, "out_hidden_size": text.hidden_size},
        **_token_fields(ids),
        architectures=["Qwen3VLForConditionalGeneration"],
    )


def qwen3_vl_moe(ids: dict[str, int]) -> PretrainedConfig:
    """Qwen3-VL-MoE: Qwen3-VL's tower and shape, with 4 routed experts of width 32 (top 2) in every layer."""
    from transformers import Qwen3VLMoeConfig

    text = PRESETS["tiny"]
    rope = {"rope_type": "default", "rope_theta": 500000.0, "mrope_section": _mrope_section(text.head_dim),
            "mrope_interleaved": True}
    return Qwen3VLMoeConfig(
        text_config={**_text_fields(ids), "intermediate_size": text.intermediate_size, "moe_intermediate_size": 32,
                     "num_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": text.num_hidden_layers,
                     "rope_parameters": rope},
        vision_config={**_VISION, "out_hidden_size": text.hidden_size},
        **_token_fields(ids),
        architectures=["Qwen3VLMoeForConditionalGeneration"],
    )


def _qwen3_5_rope() -> dict[str, Any]:
    """Qwen3.5's partial interleaved M-RoPE: a quarter of each head rotates."""
    rotary = PRESETS["tiny"].head_dim // 4
    return {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
            "mrope_section": _mrope_section(rotary), "mrope_interleaved": True}


def _qwen3_5_vision() -> dict[str, Any]:
    vision = {key: value for key, value in _VISION.items() if key != "deepstack_visual_indexes"}
    return {**vision, "out_hidden_size": PRESETS["tiny"].hidden_size}


def qwen3_5_vl(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import Qwen3_5Config

    text = {**_text_fields(ids), **linear_attention_fields(), "intermediate_size": 128,
            "num_hidden_layers": 2, "rope_parameters": _qwen3_5_rope()}
    return Qwen3_5Config(text_config=text, vision_config=_qwen3_5_vision(), **_token_fields(ids),
                         architectures=["Qwen3_5ForConditionalGeneration"])


def qwen3_5_moe_vl(ids: dict[str, int]) -> PretrainedConfig:
    from transformers import Qwen3_5MoeConfig

    text = {**_text_fields(ids), **linear_attention_fields(), **moe_fields(), "num_hidden_layers": 2,
            "rope_parameters": _qwen3_5_rope()}
    return Qwen3_5MoeConfig(text_config=text, vision_config=_qwen3_5_vision(), **_token_fields(ids),
                            architectures=["Qwen3_5MoeForConditionalGeneration"])


VLM_FAMILIES: Mapping[str, Callable[[dict[str, int]], PretrainedConfig]] = MappingProxyType({
    VLM_PRESET: qwen3_vl,
    "qwen3_vl_moe": qwen3_vl_moe,
    "qwen3_5_vl": qwen3_5_vl,
    "qwen3_5_moe_vl": qwen3_5_moe_vl,
})
"""Vision-language presets: name -> the tiny config, given the tokenizer's special-token ids."""


def write_tiny_vlm(directory: Path, seed: int = 0, preset: str = VLM_PRESET) -> Path:
    """Write a random tiny vision-language model of `preset` (Qwen3-VL by default), its tokenizer and its
    preprocessor_config.json into `directory`. The same seed gives the same weights; the global torch RNG is
    left untouched. Returns `directory`.
    """
    directory = Path(directory)
    ids = write_tokenizer(directory)
    config = VLM_FAMILIES[preset](ids)
    return write_model(directory, config, ids, seed, name=preset,
                       extra_files={"preprocessor_config.json": PREPROCESSOR_CONFIG})
