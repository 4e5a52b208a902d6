"""`tx models make-tiny`: which tiny model a name gets, and writing it.

A preset is one of: the Qwen3 text shapes of `tiny.py` ("tiny", "bench", "vocab-h64", "vocab-h256"; "qwen3"
is "tiny"), a family of `tiny_families.py` (qwen3_5, qwen3_5_moe, qwen3_moe, deepseek_v3, gpt_oss, gemma3,
llama, olmo3, nemotron_h, deepseek_v4, glm_moe_dsa, inkling, inkling_o200k, inkling2, mistral_large4) or a vision-language
one of `tiny_vlm.py` ("vlm" = Qwen3-VL, qwen3_vl_moe, qwen3_5_vl, qwen3_5_moe_vl). inkling2 needs
transformers >= 5.23 and mistral_large4 >= 5.22: with an older one, writing them is a ValueError saying so.

Without an explicit preset, the hub name picks the family (`NAME_PATTERNS`, first match wins, ignoring
case): `Qwen/Qwen3.5-4B` gets a tiny Qwen3.5 vision-language model, as the real checkpoint is one. A name no
pattern knows is an error naming the presets: a tiny model of the wrong family would hide every bug of the
real one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from tx.models.tiny import PRESETS, write_tiny_text_model
from tx.models.tiny_families import TEXT_FAMILIES
from tx.models.tiny_files import write_model, write_tokenizer
from tx.models.tiny_vlm import VLM_FAMILIES, write_tiny_vlm

ALIASES: Mapping[str, str] = MappingProxyType({"qwen3": "tiny"})

NAME_PATTERNS: tuple[tuple[str, str | None], ...] = (
    # Qwen3.5 / 3.6 are natively multimodal; "-A<n>B" marks the mixture-of-experts checkpoints
    (r"Qwen/Qwen3\.[5-9]-.*-A\d+B.*", "qwen3_5_moe_vl"),
    (r"Qwen/Qwen3\.[5-9]-.*", "qwen3_5_vl"),
    (r"Qwen/Qwen3-VL-.*-A\d+B.*", "qwen3_vl_moe"),
    (r"Qwen/Qwen3-VL-.*", "vlm"),
    (r"Qwen/Qwen3-.*-A\d+B.*", "qwen3_moe"),
    (r"Qwen/Qwen3-\d.*", "tiny"),
    (r"deepseek-ai/DeepSeek-V4.*", "deepseek_v4"),
    (r"deepseek-ai/DeepSeek-V3.*", "deepseek_v3"),
    (r"moonshotai/Kimi-K2.*", "deepseek_v3"),  # Kimi K2's language model is DeepSeek-V3's architecture
    (r"openai/gpt-oss-.*", "gpt_oss"),
    (r"google/gemma-3-.*", "gemma3"),
    (r"meta-llama/(Meta-)?Llama-3.*", "llama"),
    (r"nvidia/NVIDIA-Nemotron-3-.*", "nemotron_h"),
    (r"zai-org/GLM-5.*", "glm_moe_dsa"),
    (r"allenai/Olmo-3.*", "olmo3"),
    (r"mistralai/Mistral[-_]?Large[-_]?4([-_.].*)?", "mistral_large4"),
    (r"thinkingmachines/Inkling[-_]?2([-_.].*)?", "inkling2"),
    (r"thinkingmachines/Inkling.*", "inkling"),
)
"""Hub-name pattern -> preset (None: a known family with no tiny preset). Matched against the whole name,
without a `:suffix` (the cookbook's `Qwen/Qwen3.6-35B-A3B:peft:262144`)."""


def all_presets() -> list[str]:
    """Every preset name `write_tiny_model` takes."""
    return sorted([*PRESETS, *ALIASES, *TEXT_FAMILIES, *VLM_FAMILIES])


def preset_for_name(name: str) -> str:
    """The preset a hub name gets; ValueError for a name whose family has no tiny preset."""
    bare = name.split(":", 1)[0]
    for pattern, preset in NAME_PATTERNS:
        if re.fullmatch(pattern, bare, flags=re.IGNORECASE):
            if preset is None:
                break
            return preset
    raise ValueError(
        f"no tiny model family is known for {name!r}; pass one with --preset ({', '.join(all_presets())})"
    )


def write_tiny_model(directory: Path, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the tiny model called `preset` (see the module docstring) into `directory`."""
    preset = ALIASES.get(preset, preset)
    if preset in PRESETS:
        return write_tiny_text_model(directory, preset=preset, seed=seed)
    if preset in VLM_FAMILIES:
        return write_tiny_vlm(directory, seed=seed, preset=preset)
    if preset not in TEXT_FAMILIES:
        raise ValueError(f"unknown tiny-model preset {preset!r}; choose one of {all_presets()}")
    directory = Path(directory)
    ids = write_tokenizer(directory)
    return write_model(directory, TEXT_FAMILIES[preset](ids), ids, seed, name=preset)
