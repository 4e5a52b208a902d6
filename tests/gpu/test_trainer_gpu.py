"""The trainer at a real size on one GPU: a 128 x 2,048-token forward_backward of Qwen3-0.6B's real config
(random weights) in bf16, with the default micro-batch budget and gradient checkpointing. Prints tokens/s
and peak device memory. Run with `pytest tests/gpu -m gpu -s`.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tx.optimizers import AdamParams
from tx.types import Datum, ForwardBackwardInput, LoraConfig, ModelInput

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _qwen3_0_6b(path):
    """Qwen/Qwen3-0.6B's config.json values, random weights, written with save_pretrained."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40_960,
        rope_theta=1_000_000, rms_norm_eps=1e-6, tie_word_embeddings=True, architectures=["Qwen3ForCausalLM"],
    )
    with torch.device("cuda"):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path)
    del model
    torch.cuda.empty_cache()
    return path


def test_qwen3_0_6b_forward_backward_128_x_2048_fits(tmp_path):
    from tx.backends.torch.backend import TorchBackend

    backend = TorchBackend({"qwen3-0.6b": _qwen3_0_6b(tmp_path / "qwen3-0.6b")}, device="cuda")
    assert backend.settings.dtype == "bfloat16" and backend.settings.gradient_checkpointing
    backend.create_model("run", "qwen3-0.6b", LoraConfig(rank=32, seed=0))
    rows = np.random.default_rng(0).integers(0, 151_000, size=(128, 2049))
    data = [Datum(ModelInput.from_tokens(r[:-1].tolist()), {"target_tokens": r[1:]}) for r in rows]
    batch = ForwardBackwardInput(data, "cross_entropy")
    backend.forward_backward("run", ForwardBackwardInput(data[:2], "cross_entropy"))  # warm-up
    backend.optim_step("run", AdamParams(learning_rate=1e-5))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    result = backend.forward_backward("run", batch)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"\nqwen3-0.6b 128x2048 bf16: {128 * 2048 / elapsed:.0f} tokens/s, peak {peak:.1f} GiB, "
          f"micro-batches of {backend._budgets['qwen3-0.6b']} tokens")
    assert np.isfinite(result.metrics["loss:sum"])
    assert len(result.loss_fn_outputs) == 128
    assert all(g is not None for g in backend.gradients("run").values())
    # whether runs on it share a training pass in bfloat16 (tx/backends/torch/fusion_check.py): random weights
    # at 28 layers round stacked and alone apart by 0.04-0.23 of the hidden states' scale on an H100
    print(f"runs share a pass: {backend._fuses('qwen3-0.6b')}")
