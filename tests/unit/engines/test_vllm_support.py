"""What tx concludes from vLLM's answers about a model (`engines/vllm/support.py`), without vLLM: the rules."""

from __future__ import annotations

from tx.inference.engines.vllm.child import VllmError
from tx.inference.engines.vllm.support import adapter_refused, refusal, refuses_adapter


def test_refusals_say_why() -> None:
    assert refusal({"platform": "cuda", "lora": True}, moe=True) is None
    assert refusal({"platform": "cpu", "lora": True}, moe=False) is None
    assert "Triton" in str(refusal({"platform": "cpu", "lora": True}, moe=True))
    assert "LoRA" in str(refusal({"platform": "cuda", "lora": False}, moe=False))
    assert refusal({"error": "its model code cannot be imported here"}, moe=False) == (
        "its model code cannot be imported here")


def test_an_adapter_vllm_refuses_is_the_users_error_and_a_crash_is_not() -> None:
    # vLLM 0.32 answers 500 when an adapter's modules do not fit the model (measured with Gemma 3's lm_head)
    refused = VllmError(500, "Call to add_lora method failed: expected target modules in {'q_proj'} but received "
                             "['lm_head']")
    assert refuses_adapter(refused)
    assert "train_unembed=False" in str(adapter_refused(refused))
    assert not refuses_adapter(VllmError(500, "EngineCore encountered an issue"))
    assert refuses_adapter(VllmError(400, "bad adapter"))
