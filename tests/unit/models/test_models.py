"""Tests of tx.models: synthetic tokenizer, tiny random models, HF-cache layout and name resolution."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tx.models import PRESETS, build_tokenizer, resolve_model_dir, write_tiny_text_model, write_to_hf_cache
from tx.models.tokenizer import ADDED_TOKENS, NUM_REGULAR_TOKENS, SPECIAL_TOKENS
from tx.types import NotFoundError

EXPECTED_IDS = {token: NUM_REGULAR_TOKENS + i for i, token in enumerate(SPECIAL_TOKENS + ADDED_TOKENS)}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_text_model(tmp_path_factory.mktemp("tiny"), preset="tiny", seed=0)


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("hf_home")
    write_to_hf_cache("Org/Tiny-Model", home, preset="tiny")
    return home


def _run_offline(code: str, hf_home: Path) -> str:
    """Run `code` in a fresh interpreter with HF_HOME=hf_home and HF_HUB_OFFLINE=1; return its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "HF_HOME", "TRANSFORMERS_CACHE")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_tokenizer_build_is_deterministic(tmp_path: Path) -> None:
    build_tokenizer(tmp_path / "a")
    build_tokenizer(tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert "tokenizer.json" in names and "tokenizer_config.json" in names
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_special_tokens_are_single_ids(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    for token, expected in EXPECTED_IDS.items():
        assert tokenizer.encode(token, add_special_tokens=False) == [expected], token
        assert tokenizer.encode(f"a {token}\n", add_special_tokens=False).count(expected) == 1, token
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == EXPECTED_IDS["<|im_end|>"]
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == EXPECTED_IDS["<|endoftext|>"]
    assert len(tokenizer) == NUM_REGULAR_TOKENS + len(SPECIAL_TOKENS) + len(ADDED_TOKENS)
    text = "The answer: 12+7=19.\n<think>\nok\n</think>"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_renders(tiny_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    no_think = tokenizer.apply_chat_template(
        messages[1:2], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}
    with_tools = tokenizer.apply_chat_template(
        [
            messages[1],
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "4"},
        ],
        tools=[{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}],
        tokenize=False,
    )
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}\n</tool_call><|im_end|>' in with_tools
    assert with_tools.endswith("<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n")
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    newline = tokenizer.encode("\n", add_special_tokens=False)
    assert ids.count(EXPECTED_IDS["<|im_start|>"]) == 4
    assert ids[-2:] == [EXPECTED_IDS["<|im_end|>"], *newline]


def test_tiny_model_loads_and_runs(tiny_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["eos_token_id"] == EXPECTED_IDS["<|im_end|>"]
    assert config["pad_token_id"] == EXPECTED_IDS["<|endoftext|>"]
    assert config["head_dim"] == 32 and config["initializer_range"] == 0.1
    assert config["vocab_size"] == PRESETS["tiny"].vocab_size >= max(EXPECTED_IDS.values()) + 1
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.dtype == torch.float32
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, EXPECTED_IDS["<|im_end|>"]]])).logits
    assert logits.shape == (1, 4, PRESETS["tiny"].vocab_size)
    assert torch.isfinite(logits).all()


def test_tiny_model_weights_are_seeded(tiny_dir: Path, tmp_path: Path) -> None:
    same = write_tiny_text_model(tmp_path / "same", seed=0)
    other = write_tiny_text_model(tmp_path / "other", seed=1)
    weights = (tiny_dir / "model.safetensors").read_bytes()
    assert (same / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights
    assert (same / "config.json").read_bytes() == (tiny_dir / "config.json").read_bytes()


def test_unknown_preset_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tiny-model preset"):
        write_tiny_text_model(tmp_path, preset="huge")


def test_bench_preset_size() -> None:
    shape = PRESETS["bench"]
    num_heads = shape.num_attention_heads + shape.num_key_value_heads
    attention = shape.hidden_size * shape.head_dim * 2 * num_heads
    mlp = 3 * shape.hidden_size * shape.intermediate_size
    layers = shape.num_hidden_layers * (attention + mlp)
    total = layers + 2 * shape.vocab_size * shape.hidden_size
    assert 19e6 < total < 23e6


@pytest.mark.parametrize("name", ["no-slash", "a/b/c", "Org/bad--name", "Org/", "/Name", "Org/na me"])
def test_bad_hub_names_are_rejected(name: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="name"):
        write_to_hf_cache(name, tmp_path, preset="tiny")
    assert not (tmp_path / "hub").exists() or not any((tmp_path / "hub").iterdir())


def test_hub_layout_and_overwrite(hf_home: Path) -> None:
    repo_dir = hf_home / "hub" / "models--Org--Tiny-Model"
    commit = (repo_dir / "refs" / "main").read_text()
    assert len(commit) == 40 and int(commit, 16) >= 0
    snapshot = repo_dir / "snapshots" / commit
    before = (snapshot / "model.safetensors").read_bytes()
    assert write_to_hf_cache("Org/Tiny-Model", hf_home, preset="tiny", seed=1) == snapshot
    assert (repo_dir / "refs" / "main").read_text() == commit
    assert (snapshot / "model.safetensors").read_bytes() != before
    assert sorted(p.name for p in (repo_dir / "snapshots").iterdir()) == [commit]
    write_to_hf_cache("Org/Tiny-Model", hf_home, preset="tiny", seed=0)
    assert (snapshot / "model.safetensors").read_bytes() == before


def test_hub_name_loads_offline_with_transformers(hf_home: Path) -> None:
    out = _run_offline(
        """
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained("Org/Tiny-Model")
        model = AutoModelForCausalLM.from_pretrained("Org/Tiny-Model")
        ids = tokenizer.encode("<|im_start|>user\\nhi<|im_end|>")
        logits = model(torch.tensor([ids])).logits
        print(tokenizer.eos_token_id, ids[0], logits.shape[-1])
        """,
        hf_home,
    )
    assert out.split() == [str(EXPECTED_IDS["<|im_end|>"]), str(EXPECTED_IDS["<|im_start|>"]), "2048"]


def test_resolve_model_dir_finds_cached_name(hf_home: Path) -> None:
    out = _run_offline(
        """
        from tx.models import resolve_model_dir
        print(resolve_model_dir("Org/Tiny-Model"))
        """,
        hf_home,
    )
    snapshot = Path(out.strip())
    assert snapshot.parent.parent == hf_home / "hub" / "models--Org--Tiny-Model"
    assert (snapshot / "config.json").is_file()


def test_resolve_model_dir_reads_env_at_call_time(hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert (resolve_model_dir("Org/Tiny-Model") / "tokenizer.json").is_file()
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_home / "elsewhere"))
    with pytest.raises(NotFoundError):
        resolve_model_dir("Org/Tiny-Model")


def test_resolve_model_dir_local_directory(tiny_dir: Path) -> None:
    assert resolve_model_dir(str(tiny_dir)) == tiny_dir


@pytest.mark.parametrize("name", ["Org/Missing-Model", "missing"])
def test_resolve_model_dir_missing_offline(name: str, hf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(NotFoundError) as info:
        resolve_model_dir(name)
    message = str(info.value)
    assert f"tx models make-tiny {name}" in message and str(hf_home / "hub") in message
    assert "offline (--offline or HF_HUB_OFFLINE=1)" in message


def test_resolve_model_dir_neither_directory_nor_hub_id(hf_home: Path) -> None:
    with pytest.raises(NotFoundError, match="neither a local directory nor a hub id"):
        resolve_model_dir("a/b/c")
