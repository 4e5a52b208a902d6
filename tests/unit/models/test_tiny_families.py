"""`tx models make-tiny`: a tiny model of the family the name says (or of the preset given), never a silent
Qwen3."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tx.models import all_presets, preset_for_name, write_tiny_model

# name -> (preset, architecture): the cookbook's default model names first (tinker-cookbook 0.6.1)
NAMES = {
    "Qwen/Qwen3.5-4B": ("qwen3_5_vl", "Qwen3_5ForConditionalGeneration"),
    "Qwen/Qwen3.5-9B-Base": ("qwen3_5_vl", "Qwen3_5ForConditionalGeneration"),
    "Qwen/Qwen3.6-27B": ("qwen3_5_vl", "Qwen3_5ForConditionalGeneration"),
    "Qwen/Qwen3.5-397B-A17B": ("qwen3_5_moe_vl", "Qwen3_5MoeForConditionalGeneration"),
    "Qwen/Qwen3.6-35B-A3B:peft:262144": ("qwen3_5_moe_vl", "Qwen3_5MoeForConditionalGeneration"),
    "Qwen/Qwen3-8B": ("tiny", "Qwen3ForCausalLM"),
    "Qwen/Qwen3-30B-A3B-Instruct-2507": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "Qwen/Qwen3-VL-8B-Instruct": ("vlm", "Qwen3VLForConditionalGeneration"),
    "deepseek-ai/DeepSeek-V3.1": ("deepseek_v3", "DeepseekV3ForCausalLM"),
    "moonshotai/Kimi-K2.6": ("deepseek_v3", "DeepseekV3ForCausalLM"),
    "openai/gpt-oss-20b": ("gpt_oss", "GptOssForCausalLM"),
    "google/gemma-3-1b-it": ("gemma3", "Gemma3ForCausalLM"),
    "meta-llama/Llama-3.1-8B-Instruct": ("llama", "LlamaForCausalLM"),
    "Qwen/Qwen3-VL-30B-A3B-Instruct": ("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration"),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("nemotron_h", "NemotronHForCausalLM"),
    "deepseek-ai/DeepSeek-V4-Flash": ("deepseek_v4", "DeepseekV4ForCausalLM"),
    "zai-org/GLM-5": ("glm_moe_dsa", "GlmMoeDsaForCausalLM"),
    "allenai/Olmo-3-7B-Instruct": ("olmo3", "Olmo3ForCausalLM"),
    "thinkingmachines/Inkling": ("inkling", "InklingForConditionalGeneration"),
    "thinkingmachines/Inkling-2-Small-MXFP8": ("inkling2", "Inkling2ForConditionalGeneration"),
    "mistralai/Mistral-Large-4-1T-A52B": ("mistral_large4", "MistralLarge4ForConditionalGeneration"),
}
SPELLINGS = {  # more spellings of the newest families' hub ids
    "thinkingmachines/Inkling-2": "inkling2",
    "thinkingmachines/inkling2-small": "inkling2",
    "thinkingmachines/Inkling-Small": "inkling",
    "mistralai/Mistral-Large-4": "mistral_large4",
    "mistralai/Mistral-Large-4-Instruct-2606:peft": "mistral_large4",
    "mistralai/Mistral_Large_4": "mistral_large4",
}
ARCHITECTURES = {preset: arch for preset, arch in NAMES.values()} | {
    "qwen3_5": "Qwen3_5ForCausalLM", "qwen3_5_moe": "Qwen3_5MoeForCausalLM",
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_the_name_picks_the_family(name: str) -> None:
    assert preset_for_name(name) == NAMES[name][0]


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_other_spellings_pick_the_family(name: str) -> None:
    assert preset_for_name(name) == SPELLINGS[name]


@pytest.mark.parametrize(
    "name", ["Qwen/Qwen2.5-7B", "mistralai/Mistral-7B-v0.1", "nvidia/Nemotron-H-8B-Base-8K",
             "mistralai/Mistral-Large-Instruct-2411", "mistralai/Mistral-Large-40B"]
)
def test_an_unknown_family_is_an_error_naming_the_presets(name: str) -> None:
    with pytest.raises(ValueError, match=r"no tiny model family is known .*--preset .*qwen3_5_moe"):
        preset_for_name(name)


def test_make_tiny_refuses_an_unknown_name_without_a_preset(tmp_path: Path) -> None:
    name = "mistralai/Mistral-7B-v0.1"
    cmd = [sys.executable, "-m", "tx.cli", "models", "make-tiny", name, "--out", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "--preset" in result.stderr
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize(("preset", "needed"), [("inkling2", "5.23"), ("mistral_large4", "5.22")])
def test_a_family_newer_than_the_installed_transformers_names_the_version(
    preset: str, needed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers

    config_class = {"inkling2": "Inkling2Config", "mistral_large4": "MistralLarge4Config"}[preset]
    monkeypatch.setattr(transformers, config_class, None)  # what getattr(transformers, name, None) gives there
    monkeypatch.setattr(transformers, "__version__", "5.19.0")
    with pytest.raises(ValueError, match=rf"the {preset} family needs transformers >= {needed} \({config_class}\); "
                                         r"installed: transformers 5\.19\.0"):
        write_tiny_model(tmp_path, preset=preset)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("preset", sorted(ARCHITECTURES))
def test_each_family_preset_builds_and_runs(preset: str, tmp_path: Path) -> None:
    import torch

    from tx.models.tiny_families import installed

    if not installed(preset):
        pytest.skip(f"{preset} needs a newer transformers")

    from tx.models.auto import load_pretrained

    directory = write_tiny_model(tmp_path, preset=preset, seed=0)
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == [ARCHITECTURES[preset]]
    text = config.get("text_config", config)
    assert text["vocab_size"] == 2048 and text["hidden_size"] == 64
    assert text.get("head_dim", 32) >= 32  # vLLM's CPU attention needs it (docs/tiny-models.md)
    model = load_pretrained(directory)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000  # tiny: CI stays fast
    with torch.no_grad():
        logits = model(input_ids=torch.arange(40)[None], use_cache=False).logits
    assert logits.shape == (1, 40, 2048) and torch.isfinite(logits).all()


def test_presets_list_every_family() -> None:
    assert set(ARCHITECTURES) <= set(all_presets())


def test_inkling_o200k_has_the_real_interface_the_cookbook_renders_for() -> None:
    """The cookbook renders Inkling with the real o200k tokenizer and 80-bin DMel (docs/cookbook.md#audio-recipes):
    the tiny model under `--preset inkling_o200k` takes those ids and that audio shape, as the real config does."""
    from transformers import InklingConfig

    from tx.models.tiny_families import TEXT_FAMILIES
    from tx.models.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS

    ids = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *ADDED_TOKENS])}
    config, real = TEXT_FAMILIES["inkling_o200k"](ids), InklingConfig()
    # the tokenizer's ids (o200k_base and the chat specials, the last 200,057), without the real config's padding
    # to 201,024 that a random model would sample and the cookbook could not decode
    assert config.text_config.vocab_size == 200058 < real.text_config.vocab_size == 201024
    for key in ("image_token_id", "image_bos_token_id", "audio_token_id", "audio_bos_token_id"):
        assert getattr(config, key) == getattr(real, key), key
    assert (config.audio_config.n_mel_bins, config.audio_config.mel_vocab_size) == (80, 256)
    assert config.text_config.hidden_size == TEXT_FAMILIES["inkling"](ids).text_config.hidden_size == 64
