"""A tiny random Qwen3-VL vision-language model, written to a directory like a hub snapshot.

The image processor config is the one the tinker-cookbook computes its `expected_tokens` with for Qwen3-VL
(docs/cookbook.md#images-and-their-token-counts): patch 16, merge 2, temporal patch 2, at least 65536 pixels after resizing,
mean/std 0.5. So a 64x48 image is 70 tokens, 32x32 is 64 and 480x360 is 165, on the client and on the server.

The language model has the shape of the text "tiny" preset (hidden 64, head_dim 32, `initializer_range=0.1`);
the vision tower is 2 blocks of width 64 with head size 32, and no deepstack layers (docs/tiny-models.md#vision-language-models).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tx.models.tiny import PRESETS, token_ids
from tx.models.tokenizer import EOS_TOKEN, PAD_TOKEN, build_tokenizer

if TYPE_CHECKING:
    from transformers import Qwen3VLConfig

logger = logging.getLogger(__name__)

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


def _qwen3_vl_config(ids: dict[str, int]) -> Qwen3VLConfig:
    from transformers import Qwen3VLConfig

    text = PRESETS["tiny"]
    half = text.head_dim // 2
    mrope_section = [half - 2 * (half // 3), half // 3, half // 3]  # sums to head_dim / 2
    return Qwen3VLConfig(
        text_config={
            "vocab_size": text.vocab_size,
            "hidden_size": text.hidden_size,
            "intermediate_size": text.intermediate_size,
            "num_hidden_layers": text.num_hidden_layers,
            "num_attention_heads": text.num_attention_heads,
            "num_key_value_heads": text.num_key_value_heads,
            "head_dim": text.head_dim,
            "max_position_embeddings": 4096,
            "initializer_range": text.initializer_range,
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                "mrope_section": mrope_section, "mrope_interleaved": True},
            "bos_token_id": ids[PAD_TOKEN],
            "eos_token_id": ids[EOS_TOKEN],
            "pad_token_id": ids[PAD_TOKEN],
            "tie_word_embeddings": False,
        },
        vision_config={**_VISION, "out_hidden_size": text.hidden_size},
        image_token_id=ids[IMAGE_TOKEN],
        video_token_id=ids[VIDEO_TOKEN],
        vision_start_token_id=ids[VISION_START_TOKEN],
        vision_end_token_id=ids[VISION_END_TOKEN],
        tie_word_embeddings=False,
        architectures=["Qwen3VLForConditionalGeneration"],
    )


def write_tiny_vlm(directory: Path, seed: int = 0) -> Path:
    """Write a random tiny Qwen3-VL, its tokenizer and its preprocessor_config.json into `directory`.

    The same seed gives the same weights; the global torch RNG is left untouched. Returns `directory`.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    directory = Path(directory)
    build_tokenizer(directory)
    ids = token_ids(directory)
    config = _qwen3_vl_config(ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3VLForConditionalGeneration(config).to(torch.float32)  # pyright: ignore[reportArgumentType]
    config.save_pretrained(str(directory))
    GenerationConfig(
        bos_token_id=ids[PAD_TOKEN], eos_token_id=ids[EOS_TOKEN], pad_token_id=ids[PAD_TOKEN]
    ).save_pretrained(str(directory))
    (directory / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
    tensors = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    weights = directory / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    weights.chmod(0o644)
    logger.info("wrote tiny VLM (seed %d, %d parameters) to %s", seed, model.num_parameters(), directory)
    return directory
