"""Real models' shapes with random weights, for the benches at real size (the GPU checks' Qwen3-0.6B and -8B).

`write_random_model(shape, directory)` writes a Hugging Face model directory: the real config.json values of
the named model, random weights (the model's own initialization, made on `device`, saved in bfloat16) and the
tiny Qwen3 tokenizer, whose vocabulary is Qwen3's 151,936 ids, so tx and transformers load it as they load the
real one. No hub is needed. `--layers N` keeps every width and the vocabulary and cuts the depth (the
benches' smallest settings on a CPU).

    python scripts/bench/real_shapes.py --shape qwen3-8b --out /tmp/qwen3-8b [--device cuda] [--layers N]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch

# The config.json values of Qwen/Qwen3-0.6B and Qwen/Qwen3-8B (published with the models).
SHAPES: dict[str, dict] = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, tie_word_embeddings=False),
}
_QWEN3 = dict(vocab_size=151_936, head_dim=128, max_position_embeddings=40_960, rope_theta=1_000_000,
              rms_norm_eps=1e-6, bos_token_id=151_643, eos_token_id=151_645, architectures=["Qwen3ForCausalLM"])
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def config_of(shape: str, layers: int | None = None):
    from transformers import Qwen3Config

    values = {**_QWEN3, **SHAPES[shape]}
    if layers is not None:
        values["num_hidden_layers"] = layers
    return Qwen3Config(**values)


def write_random_model(shape: str, directory: Path, device: str = "cpu", layers: int | None = None,
                       seed: int = 0) -> Path:
    """`shape`'s real config with random weights (bfloat16) and Qwen3's vocabulary's tokenizer, in `directory`."""
    from transformers import AutoModelForCausalLM

    from tx.models import write_tiny_text_model

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config_of(shape, layers), dtype=torch.bfloat16)
    model.save_pretrained(str(directory))
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    with tempfile.TemporaryDirectory(prefix="tx-tokenizer-") as tmp:
        tiny = write_tiny_text_model(Path(tmp) / "tokenizer", preset="vocab-h64")  # Qwen3's 151,936 ids
        for name in TOKENIZER_FILES:
            if (tiny / name).exists():
                shutil.copy(tiny / name, directory / name)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than the real model")
    args = parser.parse_args()
    print(write_random_model(args.shape, args.out, args.device, args.layers))


if __name__ == "__main__":
    main()
