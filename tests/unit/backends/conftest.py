"""A tiny random Qwen3 saved to disk, and a TorchBackend serving it (no hub, no tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from backend_helpers import TINY_MAX_LEN, TINY_NAME, TINY_VOCAB


def tiny_qwen3_config() -> transformers.Qwen3Config:
    return transformers.Qwen3Config(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=TINY_MAX_LEN,
        initializer_range=0.1,
        tie_word_embeddings=False,
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A seeded tiny Qwen3ForCausalLM written with save_pretrained."""
    path = tmp_path_factory.mktemp("tiny-qwen3")
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        model = transformers.Qwen3ForCausalLM(tiny_qwen3_config())
    model.save_pretrained(path)
    return path


@pytest.fixture
def backend(tiny_model_dir: Path):
    from tx.backends.torch.backend import TorchBackend

    return TorchBackend({TINY_NAME: tiny_model_dir}, device="cpu")
