"""API keys -> principals.

The SDK sends `X-API-Key: tml-...` on every request; OpenAI clients (the /oai routes) send the same
key as `Authorization: Bearer tml-...`. With keys configured, only those keys are
accepted. With none configured (allowed only on loopback, see `tx.config`), any key with the
`tml-` prefix is accepted and acts as its own tenant. Resources belong to the key that made them:
the owner is a hash of the key, so raw keys are never stored.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from fastapi import HTTPException, Request


@dataclass(frozen=True)
class Principal:
    owner: str


class KeyChecker:
    def __init__(self, api_keys: list[str]) -> None:
        self._keys = [k.encode() for k in api_keys]

    def __call__(self, request: Request) -> Principal:
        key = _key(request)
        if not key:
            raise HTTPException(401, "missing X-API-Key header (or Authorization: Bearer <key>)")
        if not key.startswith("tml-"):
            raise HTTPException(401, "invalid API key: keys start with 'tml-'")
        if self._keys and not any(hmac.compare_digest(key.encode(), k) for k in self._keys):
            raise HTTPException(401, "invalid API key")
        return Principal(owner=hashlib.sha256(key.encode()).hexdigest()[:32])


class OperatorChecker:
    """Operator routes (/metrics): open when no API keys are set (loopback only, see `tx.config`);
    otherwise only an operator key opens them (X-API-Key or Authorization: Bearer)."""

    def __init__(self, api_keys: list[str], operator_keys: list[str]) -> None:
        self._open = not api_keys
        self._keys = [k.encode() for k in operator_keys]

    def is_operator_key(self, request: Request) -> bool:
        """Whether the request carries one of the operator keys (the console then shows every tenant's rows)."""
        key = _key(request)
        return bool(key) and any(hmac.compare_digest(key.encode(), k) for k in self._keys)

    def allows(self, request: Request) -> bool:
        """Whether operator routes answer this request."""
        return self._open or self.is_operator_key(request)

    def __call__(self, request: Request) -> None:
        if self._open:
            return
        key = _key(request)
        if not key:
            raise HTTPException(401, "operator routes need an operator key (X-API-Key or Authorization: Bearer)")
        if not any(hmac.compare_digest(key.encode(), k) for k in self._keys):
            raise HTTPException(403, "this key is not an operator key (--operator-key / TX_OPERATOR_KEYS)")


def _key(request: Request) -> str:
    return request.headers.get("x-api-key", "") or _bearer(request.headers.get("authorization", ""))


def _bearer(header: str) -> str:
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
