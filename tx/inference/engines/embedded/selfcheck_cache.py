"""The self-check's decisions (`selfcheck.py`), kept so that an engine restarting on the same model skips the
check: at real sizes on a CPU it is most of a load (13.7 s of 18.7 s for Nemotron-3 at its real hidden size).

A decision is reused only under the same key: the model's fingerprint (`tx/models/fingerprint.py`: its config,
tokenizer and a sample of every weight file), the dtype and device type it runs in, the attention the engine
would run and the family's own, the torch and transformers versions, and the source of the engine code the
check exercises (this package and `tx/models/`). Anything else is a miss, and a miss runs the check: a stale
entry never serves a model. Only a check that ran is kept (not one skipped because the model's own forward
raised). The file is `$XDG_CACHE_HOME/tx/engine-selfcheck.json` (`~/.cache/...`); `TX_SELFCHECK_CACHE` names
another, and an empty value turns the cache off. A cache that cannot be read or written is ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers

from tx.inference.engines.embedded.selfcheck import LeanFor, ServingPlan, check_serving
from tx.models.fingerprint import model_fingerprint

if TYPE_CHECKING:
    from transformers import PreTrainedModel

logger = logging.getLogger(__name__)
MAX_ENTRIES = 256
CODE_ROOTS = (Path(__file__).parent, Path(__file__).parents[3] / "models")
"""The engine's own code and the model code it runs (attention, agreement): what the check's answer depends on."""


def checked_serving(model: PreTrainedModel, model_dir: Path, pad_id: int, family_attention: str,
                    lean_for: LeanFor) -> ServingPlan:
    """`check_serving`'s decision for `model`: the one kept for this model, code and versions if there is one
    (the model switched to the attention it chose), else the check's, then kept."""
    engine_attention = str(model.config._attn_implementation)
    key = key_of(model_dir, model.dtype, model.device, engine_attention, family_attention)
    kept = recall(key)
    if kept is not None:
        if kept.attention != engine_attention:
            model.set_attn_implementation(kept.attention)
        logger.info("self-check: kept decision for this model, code and versions (%s; TX_SELFCHECK_CACHE): "
                    "attention %s, padded batches %s, rows leave/copied %s, joins %s%s", cache_path(),
                    kept.attention, kept.padded, kept.reorder, kept.joins,
                    f"; REFUSED: {kept.refused}" if kept.refused else "")
        return kept
    plan = check_serving(model, pad_id, family_attention, lean_for)
    if plan.measured:  # the check ran (not skipped because the model's own forward raised)
        remember(key, plan)
    return plan


def cache_path() -> Path | None:
    """Where the decisions are kept; None when the cache is off (TX_SELFCHECK_CACHE set empty)."""
    named = os.environ.get("TX_SELFCHECK_CACHE")
    if named is not None:
        return Path(named) if named else None
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "tx" / "engine-selfcheck.json"


def key_of(model_dir: Path, dtype: torch.dtype, device: torch.device, engine_attention: str,
           family_attention: str) -> str:
    parts = [model_fingerprint(model_dir), str(dtype), device.type, engine_attention, family_attention,
             torch.__version__, transformers.__version__, _code_digest()]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@functools.cache
def _code_digest() -> str:
    digest = hashlib.sha256()
    for root in CODE_ROOTS:
        for path in sorted(root.rglob("*.py")):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()


def recall(key: str) -> ServingPlan | None:
    """The decision kept under `key`, if any."""
    entry = _read().get(key)
    if not isinstance(entry, dict):
        return None
    try:
        return ServingPlan(**entry)
    except TypeError:  # written by another version of ServingPlan
        return None


def remember(key: str, plan: ServingPlan) -> None:
    """Keep `plan` under `key` (the newest MAX_ENTRIES entries are kept), replacing the file atomically."""
    path = cache_path()
    if path is None:
        return
    entries = {k: v for k, v in _read().items() if k != key}
    entries[key] = dataclasses.asdict(plan)
    kept = dict(list(entries.items())[-MAX_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=".selfcheck-", delete=False) as out:
            json.dump(kept, out)
        os.replace(out.name, path)
    except OSError as exc:
        logger.warning("self-check: could not keep the result in %s (%s)", path, exc)
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(out.name)


def _read() -> dict[str, Any]:
    path = cache_path()
    if path is None or not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}
