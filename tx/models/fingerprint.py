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
import re
from dataclasses import dataclass
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


@dataclass(frozen=True)
class ModelProvenance:
    """Which weights a served base model is: what each training run records at create (migration 0009)."""

    revision: str | None  # the hub commit of its snapshot; None for a local directory
    fingerprint: str  # model_fingerprint of its files


_COMMIT = re.compile(r"[0-9a-f]{40}")


def hub_revision(model_dir: Path) -> str | None:
    """The commit of a hub-cache snapshot (`.../models--Org--Name/snapshots/<commit>`); None for any other
    directory (a local model has no hub revision)."""
    model_dir = Path(model_dir)
    in_cache = model_dir.parent.name == "snapshots" and model_dir.parent.parent.name.startswith("models--")
    return model_dir.name if in_cache and _COMMIT.fullmatch(model_dir.name) else None


def model_provenance(model_dir: Path) -> ModelProvenance:
    return ModelProvenance(hub_revision(model_dir), model_fingerprint(model_dir))


__all__ = ["ModelProvenance", "hub_revision", "model_fingerprint", "model_provenance"]
