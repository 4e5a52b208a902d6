"""A model's fingerprint: whether two directories (on two machines) hold the same model, cheaply.

tx checks an engine it did not start (`tx serve --engine-url`) against the base model it trains: both sides
compute this from their own copy of the files and compare. It covers what sampling depends on: the config
(keys that only record provenance, like `_name_or_path` or `transformers_version`, left out), the tokenizer
files, and the weights: every weight file's size and safetensors header (names, dtypes, shapes) plus a sample
of its bytes at evenly spaced offsets. So a different architecture, tokenizer or set of weights (another seed,
another fine-tune) differs; reading a 100 GB model costs a few dozen small reads, not a full hash.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
SAMPLES_PER_FILE = 16
SAMPLE_BYTES = 4096


def model_fingerprint(model_dir: Path) -> str:
    """`sha256:<hex>` of the model in `model_dir` (see the module docstring for what it covers)."""
    model_dir = Path(model_dir)
    digest = hashlib.sha256()
    config = json.loads((model_dir / "config.json").read_text())
    kept = {k: v for k, v in config.items() if not k.startswith("_") and k != "transformers_version"}
    digest.update(json.dumps(kept, sort_keys=True).encode())
    for name in TOKENIZER_FILES:
        path = model_dir / name
        if path.is_file():
            digest.update(name.encode() + hashlib.sha256(path.read_bytes()).digest())
    for path in sorted(p for p in model_dir.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()):
        digest.update(path.name.encode())
        digest.update(_weight_file_sample(path))
    return "sha256:" + digest.hexdigest()[:32]


def _weight_file_sample(path: Path) -> bytes:
    """The file's size, its safetensors header (when it is one) and `SAMPLES_PER_FILE` slices of its bytes."""
    size = path.stat().st_size
    parts = [str(size).encode()]
    with path.open("rb") as f:
        start = 0
        if path.suffix == ".safetensors" and size >= 8:
            header_len = int.from_bytes(f.read(8), "little")
            parts.append(f.read(min(header_len, size - 8)))
            start = 8 + header_len
        span = max(size - start - SAMPLE_BYTES, 0)
        for i in range(SAMPLES_PER_FILE):
            f.seek(start + span * i // max(SAMPLES_PER_FILE - 1, 1))
            parts.append(f.read(SAMPLE_BYTES))
    return hashlib.sha256(b"".join(parts)).digest()


__all__ = ["model_fingerprint"]
