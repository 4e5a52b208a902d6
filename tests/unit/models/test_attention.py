"""Each family gets the attention implementation it supports; a forced one is honoured, or refused clearly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tx.backends.torch.model import load_causal_lm
from tx.models import write_tiny_model
from tx.models.attention import choose_attention
from tx.types import UserError


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("attention")
    return {preset: write_tiny_model(root / preset, preset) for preset in ("gpt_oss", "qwen3_5", "deepseek_v3")}


def test_each_family_gets_what_it_supports(models: dict[str, Path]) -> None:
    assert choose_attention(models["gpt_oss"], "cpu", half_precision=False) == "eager"  # no SDPA (sinks)
    assert choose_attention(models["qwen3_5"], "cpu", half_precision=False) == "sdpa"
    assert choose_attention(models["deepseek_v3"], "cpu", half_precision=False) == "sdpa"
    assert choose_attention(models["gpt_oss"], "cuda", half_precision=True) == "flex_attention"


def test_the_trainer_loads_gpt_oss_and_honours_a_forced_choice(models: dict[str, Path]) -> None:
    model = load_causal_lm(models["gpt_oss"], torch.device("cpu"))
    assert model.config._attn_implementation == "eager"
    forced = load_causal_lm(models["qwen3_5"], torch.device("cpu"), attention="eager")
    assert forced.config._attn_implementation == "eager"


def test_a_forced_choice_the_family_lacks_is_a_user_error(models: dict[str, Path]) -> None:
    with pytest.raises(UserError, match="sdpa"):
        load_causal_lm(models["gpt_oss"], torch.device("cpu"), attention="sdpa")
