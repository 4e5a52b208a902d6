"""Credentials -> principals: API keys, and the short-lived tokens tx signs in exchange for them.

The SDK sends `X-API-Key: tml-...` on every request; OpenAI clients (the /oai routes) send the same
key as `Authorization: Bearer tml-...`. With keys configured, only those keys (and the operator keys)
are accepted. With none configured (allowed only on loopback, see `tx.config`), any key with the
`tml-` prefix is accepted and acts as its own tenant. Resources belong to the key that made them:
the owner is a hash of the key, so raw keys are never stored.

JWT mode (on by default, `--no-jwt-auth` turns it off): `client/config` tells the SDK to exchange its key
at `POST /api/v1/auth/token` for a token (HS256, signed with a random key kept in `<data-dir>/jwt.key`),
which it then sends instead of the key and renews at half its lifetime. The token names the key's owner
and expires after `--jwt-ttl-s`. An expired, forged or malformed token gets a 401 whose
`WWW-Authenticate` says `error="invalid_token"` (the SDK then exchanges its key again, once). A token
whose key was removed from the server's keys stops working at once. Keys keep working everywhere.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
from fastapi import HTTPException, Request

from tx.core.checkpoints.downloads import load_or_make_key

TOKEN_KEY_FILE = "jwt.key"
ISSUER = "tx"
MAX_CHECKED_TOKENS = 4096  # tokens whose signature was checked, kept until they expire (then the cache starts over)
_INVALID_TOKEN = {"WWW-Authenticate": 'Bearer error="invalid_token"'}


@dataclass(frozen=True)
class Principal:
    """Who calls: `owner` (a hash of their key) owns what they create; an operator also reads everyone's
    audit entries."""

    owner: str
    operator: bool = False


def owner_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def labels_by_owner(labels: dict[str, str]) -> dict[str, str]:
    """{owner id: label} from the operator's key labels (`--key-label`), each given by its key or its owner id."""
    return {owner_of(key) if key.startswith("tml-") else key: label for key, label in labels.items()}


def labels_seen(labels: dict[str, str], principal: Principal) -> dict[str, str]:
    """The key labels `principal` may read: an operator every one; anyone else their own key's, if it has one
    (others stay pseudonyms: docs/security.md)."""
    if principal.operator:
        return labels
    return {principal.owner: labels[principal.owner]} if principal.owner in labels else {}


class TokenIssuer:
    """Signs and checks tx's tokens: HS256 over {iss, sub, org_id, owner, iat, exp}."""

    def __init__(self, key: bytes, ttl_s: float) -> None:
        self._key = key
        self.ttl_s = ttl_s
        # token -> (owner, exp) once its signature and claims were checked: a token's validity depends only
        # on this key and the time, so a repeat costs a dict lookup and a clock read, not an HMAC and a claims
        # parse (~0.15 ms, on every request of the training step: docs/operations.md#the-training-steps-overhead)
        self._checked: dict[str, tuple[str, float]] = {}

    @classmethod
    def from_data_dir(cls, data_dir: Path, ttl_s: float) -> TokenIssuer:
        return cls(load_or_make_key(data_dir / TOKEN_KEY_FILE), ttl_s)

    def issue(self, owner: str, now: float | None = None, expires_by: float | None = None) -> str:
        """A token for `owner`, living --jwt-ttl-s, or less: never past `expires_by` (a token renewed with a
        token keeps the first one's end, so a stolen token cannot be renewed past it without the key)."""
        issued = int(time.time() if now is None else now)
        expires = issued + max(1, round(self.ttl_s))
        if expires_by is not None:
            expires = min(expires, int(expires_by))
        claims = {"iss": ISSUER, "sub": f"tx:key:{owner}", "org_id": owner, "owner": owner, "email": "",
                  "iat": issued, "exp": expires}
        return jwt.encode(claims, self._key, algorithm="HS256")

    def owner(self, token: str) -> str:
        """The owner a valid, unexpired token names; HTTP 401 (invalid_token) otherwise."""
        checked = self._checked.get(token)
        if checked is not None and time.time() < checked[1]:
            return checked[0]
        owner, expires = self._decode(token)
        if len(self._checked) >= MAX_CHECKED_TOKENS:
            self._checked = {}
        self._checked[token] = (owner, expires)
        return owner

    def expiry(self, token: str) -> float:
        """When a valid token ends (HTTP 401 for an invalid one, as `owner`)."""
        self.owner(token)
        return self._checked[token][1]

    def _decode(self, token: str) -> tuple[str, float]:
        try:
            claims = jwt.decode(token, self._key, algorithms=["HS256"], issuer=ISSUER,
                                options={"require": ["exp", "iat", "owner"]})
        except jwt.ExpiredSignatureError:
            raise HTTPException(401, "token expired: exchange your API key again (POST /api/v1/auth/token)",
                                headers=_INVALID_TOKEN) from None
        except jwt.InvalidTokenError as exc:
            raise HTTPException(401, f"invalid token: {exc}", headers=_INVALID_TOKEN) from None
        owner = claims["owner"]
        if not isinstance(owner, str) or not owner:
            raise HTTPException(401, "invalid token: no owner", headers=_INVALID_TOKEN)
        return owner, float(claims["exp"])


class KeyChecker:
    """A request's principal, from its X-API-Key (or Authorization: Bearer): a key, or a token of ours."""

    def __init__(self, api_keys: list[str], operator_keys: list[str] | None = None,
                 tokens: TokenIssuer | None = None) -> None:
        accepted = [*api_keys, *(operator_keys or [])] if api_keys else []  # none: any tml- key (loopback)
        self._keys = [k.encode() for k in accepted]
        self._owners = {owner_of(k) for k in accepted}
        self._operators = {owner_of(k) for k in operator_keys or []}
        self.tokens = tokens

    def __call__(self, request: Request) -> Principal:
        return self.principal(credential_of(request))

    def principal(self, credential: str) -> Principal:
        if not credential:
            raise HTTPException(401, "missing X-API-Key header (or Authorization: Bearer <key>)")
        if credential.startswith("eyJ") and self.tokens is not None:
            owner = self.tokens.owner(credential)
            if self._keys and owner not in self._owners:
                raise HTTPException(401, "invalid token: its API key is no longer accepted", headers=_INVALID_TOKEN)
            return Principal(owner, operator=owner in self._operators)
        known = any(hmac.compare_digest(credential.encode(), k) for k in self._keys)
        if not known and not credential.startswith("tml-"):
            raise HTTPException(401, "invalid API key: keys start with 'tml-'")
        if self._keys and not known:
            raise HTTPException(401, "invalid API key")
        owner = owner_of(credential)
        return Principal(owner, operator=owner in self._operators)


class OperatorChecker:
    """Operator routes (/metrics): open when no API keys are set (loopback only, see `tx.config`);
    otherwise only an operator key (or a token exchanged for one) opens them."""

    def __init__(self, api_keys: list[str], keys: KeyChecker) -> None:
        self._open = not api_keys
        self._keys = keys

    def is_operator_key(self, request: Request) -> bool:
        """Whether the request carries an operator key, or a token exchanged for one (the console then shows every
        tenant's rows)."""
        credential = credential_of(request)
        try:
            return bool(credential) and self._keys.principal(credential).operator
        except HTTPException:
            return False

    def allows(self, request: Request) -> bool:
        """Whether operator routes answer this request."""
        return self._open or self.is_operator_key(request)

    def __call__(self, request: Request) -> None:
        if self._open:
            return
        credential = credential_of(request)
        if not credential:
            raise HTTPException(401, "operator routes need an operator key (X-API-Key or Authorization: Bearer)")
        if not self._keys.principal(credential).operator:
            raise HTTPException(403, "this key is not an operator key (--operator-key / TX_OPERATOR_KEYS)")


def credential_of(request: Request) -> str:
    return request.headers.get("x-api-key", "") or _bearer(request.headers.get("authorization", ""))


def _bearer(header: str) -> str:
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""
