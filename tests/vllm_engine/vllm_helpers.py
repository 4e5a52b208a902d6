"""Helpers for the vLLM engine tests: a live tx vLLM engine, and what a plain transformers forward says."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx
import torch

from tx.inference.protocol import SECRET_HEADER

SECRET = "vllm-test-" + uuid.uuid4().hex


def vllm_missing() -> str | None:
    """Why the engine tests cannot run here, or None."""
    from tx.inference.engines.vllm import VllmUnavailable, require_vllm

    try:
        require_vllm()
    except VllmUnavailable as exc:
        return str(exc)
    return None


class LiveVllmEngine:
    """One tx vLLM engine started through `VllmLauncher`, and an httpx client that sends the secret."""

    def __init__(self, model_dir: Path, work_dir: Path) -> None:
        from tx.inference.engines.vllm.launch import VllmLauncher

        self.launcher = VllmLauncher(
            work_dir,
            SECRET,
            dtype="float32",
            max_model_len=2048,
            max_adapters=4,
            max_lora_rank=8,
            startup_timeout_s=300,
            extra_args=["--max-num-seqs", "16"],
            log_level="warning",
        )
        self.handle = asyncio.run(self.launcher.start("vllm-test", model_dir))
        self.url = self.handle.url
        self.http = httpx.Client(base_url=self.url, headers={SECRET_HEADER: SECRET}, timeout=120)

    def post(self, path: str, body: dict | None = None, expect: int = 200) -> dict:
        response = self.http.post(path, json=body if body is not None else {})
        assert response.status_code == expect, response.text
        return response.json()

    def generate(self, **body) -> dict:
        return self.post("/generate", body)

    def health(self) -> dict:
        return self.http.get("/health").json()

    def close(self) -> None:
        self.http.close()
        asyncio.run(self.launcher.stop(self.handle))


def token_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    """log_softmax of the fp32 logits at each completion token, given everything before it."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
    return logprobs[positions, torch.tensor(completion)].tolist()


def greedy(model, prompt: list[int], max_new_tokens: int, stop_at_eos: bool = True) -> list[int]:
    """`model.generate` greedy; with `stop_at_eos` the tokens end at (and include) the first EOS."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            **({} if stop_at_eos else {"eos_token_id": None, "min_new_tokens": max_new_tokens}),
        )
    new = out[0, len(prompt) :].tolist()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    for i, token in enumerate(new):
        if stop_at_eos and token in eos:
            return new[: i + 1]
    return new
