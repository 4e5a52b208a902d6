"""Signed download links: URLs that tx serves itself, which work without an API key.

`tinker checkpoint download` fetches each file of an external-weights checkpoint (and `tinker
session export-trace` a trace) with a plain GET that carries no auth header, so the URL itself is
the credential. The rules:

- A link names exactly one thing: one file of one checkpoint, or one session's trace. Its token
  holds that scope, the owner and an expiry, and an HMAC-SHA256 over all of them.
- The HMAC key is random, made once and kept in the data directory (`download.key`, mode 0600),
  so links survive a restart and no two servers share a key by accident. A key file that is empty or
  not a 32-byte hex key (a crash between creating and writing it) is replaced by a new key, written
  atomically; a key is never used empty.
- A checkpoint file's link names the checkpoint's `creation_id` (new at every save), not only its
  name: it stops working when it expires, or when its checkpoint is deleted, expires or is saved again
  under the same name; it is checked again on every request. A bad or expired link is a 404 that says which.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tx.types import NotFoundError

KEY_FILE = "download.key"


@dataclass(frozen=True)
class LinkScope:
    """What a link opens: a checkpoint file (`run_id`, `checkpoint_id`, `file`) or a session's trace."""

    kind: str  # "file" | "trace"
    owner: str
    run_id: str = ""
    checkpoint_id: str = ""
    creation_id: str = ""  # the checkpoint's save the link was made for (`CheckpointRow.creation_id`)
    file: str = ""
    session_id: str = ""


class DownloadSigner:
    def __init__(self, key: bytes, ttl_s: float) -> None:
        self._key = key
        self.ttl_s = ttl_s

    @classmethod
    def from_data_dir(cls, data_dir: Path, ttl_s: float) -> DownloadSigner:
        return cls(load_or_make_key(data_dir / KEY_FILE), ttl_s)

    def sign(self, scope: LinkScope, now: float | None = None) -> tuple[str, float]:
        """(token, expiry as a unix time) of a link to `scope`."""
        expires = int((time.time() if now is None else now) + self.ttl_s)
        payload = _b64(json.dumps({**asdict(scope), "exp": expires}, sort_keys=True).encode())
        return f"{payload}.{self._mac(payload)}", float(expires)

    def verify(self, token: str, now: float | None = None) -> LinkScope:
        """The scope of a valid, unexpired token; NotFoundError otherwise."""
        payload, _, mac = token.partition(".")
        try:
            valid = bool(payload) and hmac.compare_digest(mac.encode(), self._mac(payload).encode())
            if not valid:
                raise NotFoundError("invalid download link")
            fields: dict[str, Any] = json.loads(_unb64(payload))
            expires = fields.pop("exp")
            scope = LinkScope(**fields)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # UnicodeError is a ValueError
            raise NotFoundError("invalid download link") from exc
        if (time.time() if now is None else now) >= expires:
            raise NotFoundError("download link expired; ask for new URLs")
        return scope

    def _mac(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()


KEY_BYTES = 32


def load_or_make_key(path: Path) -> bytes:
    """The key kept at `path`; a new one (written atomically) when it is missing, empty or malformed."""
    key = _read_key(path)
    if key is not None:
        return key
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(secrets.token_bytes(KEY_BYTES).hex())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(temporary, path)
    key = _read_key(path)  # another process may have replaced it meanwhile: use the file's
    assert key is not None
    return key


def _read_key(path: Path) -> bytes | None:
    try:
        key = bytes.fromhex(path.read_text().strip())
    except (FileNotFoundError, ValueError, UnicodeError):
        return None
    return key if len(key) == KEY_BYTES else None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
