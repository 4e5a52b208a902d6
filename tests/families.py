"""The model families tx supports, as tiny presets (`tx.models.make_tiny`), shared by the family tests."""

from __future__ import annotations

from tx.models.tiny_families import installed

LINEUP = tuple(preset for preset in ("olmo3", "nemotron_h", "deepseek_v4", "glm_moe_dsa", "qwen3_vl_moe", "inkling",
                                     "inkling2", "mistral_large4") if installed(preset))
"""Hosted Tinker's newer families' tiny presets (tests/integration/test_families.py names each as users do); those
newer than the installed transformers (inkling2: 5.23, mistral_large4: 5.22) are left out (CI runs the newest)."""

FAMILIES = ("tiny", "llama", "gemma3", "qwen3_moe", "deepseek_v3", "gpt_oss", "qwen3_5", "qwen3_5_moe",
            "qwen3_5_vl", "qwen3_5_moe_vl") + LINEUP
"""Every supported family's tiny preset ("tiny" is Qwen3): the trainer's and the engines' family tests."""
