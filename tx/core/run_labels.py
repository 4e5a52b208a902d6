"""A training run's name and tags, set by its owner (issue 41): from the SDK's `user_metadata` at create (keys
`name`, and `tags` comma-separated), or from the console (PATCH /api/v1/console/runs/{run_id}).

One rule for both: a name of at most 120 characters, at most 16 distinct tags of at most 40 characters each,
none holding a comma, neither holding a control character (PostgreSQL stores no NUL in text); blanks around them
are dropped, an empty name is none. Anything else is a UserError (400) naming the limit."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tx.types import UserError

MAX_NAME_CHARS = 120
MAX_TAGS = 16
MAX_TAG_CHARS = 40


@dataclass(frozen=True)
class RunLabels:
    name: str | None = None
    tags: tuple[str, ...] = ()


NO_LABELS = RunLabels()


def run_labels(name: str | None, tags: Iterable[str]) -> RunLabels:
    """The labels, checked and tidied (see the module docstring)."""
    name = _printable((name or "").strip(), "a run's name") or None
    if name is not None and len(name) > MAX_NAME_CHARS:
        raise UserError(f"a run's name has at most {MAX_NAME_CHARS} characters; this one has {len(name)}")
    kept: list[str] = []
    for tag in (_printable(t.strip(), "a tag") for t in tags):
        if len(tag) > MAX_TAG_CHARS:
            raise UserError(f"a tag has at most {MAX_TAG_CHARS} characters; {tag[:MAX_TAG_CHARS]!r}... has {len(tag)}")
        if "," in tag:
            raise UserError(f"a tag holds no comma: {tag!r}")
        if tag and tag not in kept:
            kept.append(tag)
    if len(kept) > MAX_TAGS:
        raise UserError(f"a run has at most {MAX_TAGS} tags; {len(kept)} given")
    return RunLabels(name, tuple(kept))


def _printable(text: str, what: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise UserError(f"{what} holds a control character: {text[:MAX_TAG_CHARS]!r}")
    return text


def labels_of_metadata(user_metadata: Mapping[str, Any] | None) -> RunLabels:
    """The labels a create's `user_metadata` sets: its `name`, and its `tags` split at commas."""
    metadata = user_metadata or {}
    name, tags = metadata.get("name"), metadata.get("tags")
    for key, value in (("name", name), ("tags", tags)):
        if value is not None and not isinstance(value, str):
            raise UserError(f"user_metadata[{key!r}] is a run's {key} and must be a string (tags comma-separated)")
    return run_labels(name, (tags or "").split(","))
