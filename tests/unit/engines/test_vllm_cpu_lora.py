"""tx's wrapper of vLLM's PyTorch LoRA ops (tx/inference/engines/vllm/cpu_lora.py), on an op shaped as vLLM's
`bgmv_shrink` (no vLLM needed): rows without an adapter take none, and the rows of several requests' prompt
logprobs, which vLLM passes with one index per request, take their requests' common slot. Regression: with two
or more base-model requests asking prompt logprobs in one step, the wrapper failed (`The size of tensor a (2)
must match the size of tensor b (15)`) and vLLM's engine died; the vLLM engine's self-check found it."""

from __future__ import annotations

import pytest
import torch

from tx.inference.engines.vllm.cpu_lora import rows_without_adapter_skipped

ROWS, IN, OUT, SLOTS = 15, 8, 4, 2


def shrink(inputs: torch.Tensor, weights: torch.Tensor, output: torch.Tensor, indices: torch.Tensor) -> None:
    """vLLM's `bgmv_shrink` (torch_ops): each row times its slot's weights."""
    output[:] = torch.einsum("bi,boi->bo", inputs, weights[indices])


@pytest.fixture
def tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(ROWS, IN, generator=generator)
    weights = torch.randn(SLOTS, OUT, IN, generator=generator)
    return inputs, weights, torch.full((ROWS, OUT), 7.0)


def test_prompt_rows_of_base_requests_take_no_adapter(tensors) -> None:
    inputs, weights, output = tensors
    rows_without_adapter_skipped(shrink)(inputs, weights, output, torch.tensor([-1, -1]))
    assert torch.equal(output, torch.zeros(ROWS, OUT))


def test_prompt_rows_of_requests_of_one_adapter_take_it(tensors) -> None:
    inputs, weights, output = tensors
    rows_without_adapter_skipped(shrink)(inputs, weights, output, torch.tensor([1, 1, 1]))
    torch.testing.assert_close(output, inputs @ weights[1].T)


def test_one_index_per_row_is_kept(tensors) -> None:
    inputs, weights, output = tensors
    indices = torch.tensor([0, -1] * 7 + [1])
    rows_without_adapter_skipped(shrink)(inputs, weights, output, indices)
    want = torch.stack([inputs[r] @ weights[i].T if i >= 0 else torch.zeros(OUT) for r, i in enumerate(indices)])
    torch.testing.assert_close(output, want)
