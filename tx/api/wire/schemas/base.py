"""Bases of every Tinker JSON body, and the caps on free-form fields.

Requests ignore unknown keys, accept the SDK's `type` discriminators, and never require a field the
SDK leaves out when it is None (it sends `exclude_none` bodies). Responses carry exactly the fields
the SDK reads. These are wire objects only: `tx/api/wire/convert.py` turns them into domain types.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator


class WireRequest(BaseModel):
    """A request body: unknown keys are ignored, `model_*` field names are allowed. Every text in it
    must be valid Unicode: JSON may carry a lone UTF-16 surrogate ("\\ud800"), which no store or
    response can encode, so it is refused here (422) for every field, nested ones included."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    @field_validator("*", mode="after")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        _check_text(value)
        return value


def _check_text(value: Any) -> None:
    """Raise ValueError if any str in `value` (dict keys too) is not encodable (a lone surrogate)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("text must be valid Unicode: it holds a lone UTF-16 surrogate") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, (str, dict, list, tuple)):
                _check_text(item)


def counted_first(data: Any, caps: dict[str, int]) -> Any:
    """For a `mode="before"` model validator: `data` unless one of its lists or maps named in `caps` holds
    more items than its cap (ValueError: a 422). pydantic checks a list's `max_length` only after validating
    every item, so a 4 MB body of 130,000 tiny items costs 0.1-0.3 s of the event loop before its refusal;
    counted first, it costs nothing."""
    if isinstance(data, dict):
        for name, most in caps.items():
            value = data.get(name)
            if isinstance(value, list | dict) and len(value) > most:
                raise ValueError(f"{name} holds {len(value)} items; at most {most}")
    return data


MAX_METADATA_BYTES = 64 << 10


MAX_TAGS, MAX_TAG_CHARS = 64, 256


def _small_metadata(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None and len(json.dumps(value)) > MAX_METADATA_BYTES:
        raise ValueError(f"user_metadata is larger than {MAX_METADATA_BYTES} bytes as JSON")
    return value


UserMetadata = Annotated[dict[str, Any] | None, AfterValidator(_small_metadata)]


StrMetadata = Annotated[dict[str, str] | None, AfterValidator(_small_metadata)]


Tags = Annotated[list[Annotated[str, Field(max_length=MAX_TAG_CHARS)]], Field(max_length=MAX_TAGS)]


class WireResponse(BaseModel):
    """A response body built by tx."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class Cursor(WireResponse):
    offset: int
    limit: int
    total_count: int
