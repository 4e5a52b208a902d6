"""The model families tx supports, as tiny presets (`tx.models.make_tiny`), shared by the family tests."""

from __future__ import annotations

LINEUP = ("olmo3", "nemotron_h", "deepseek_v4", "glm_moe_dsa", "qwen3_vl_moe", "inkling")
"""Hosted Tinker's newer families' tiny presets (tests/integration/test_families.py names each as users do)."""

FAMILIES = ("tiny", "llama", "gemma3", "qwen3_moe", "deepseek_v3", "gpt_oss", "qwen3_5", "qwen3_5_moe",
            "qwen3_5_vl", "qwen3_5_moe_vl") + LINEUP
"""Every supported family's tiny preset ("tiny" is Qwen3): the trainer's and the engines' family tests."""
