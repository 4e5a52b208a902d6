"""Keys and tokens -> principals (tx/api/auth.py), in-process: expiry, forgery, a key removed from the
server's keys, operator keys through a token."""

from __future__ import annotations

import base64
import json
import time

import jwt
import pytest
from fastapi import HTTPException

from tx.api.auth import KeyChecker, Principal, TokenIssuer, labels_by_owner, labels_seen, owner_of

KEY = b"k" * 32


def refusal(checker: KeyChecker, credential: str) -> HTTPException:
    with pytest.raises(HTTPException) as info:
        checker.principal(credential)
    return info.value


def test_a_token_names_its_keys_owner_until_it_expires() -> None:
    tokens = TokenIssuer(KEY, ttl_s=60)
    checker = KeyChecker(["tml-a"], ["op-x"], tokens)
    token = tokens.issue(owner_of("tml-a"))
    assert checker.principal(token).owner == checker.principal("tml-a").owner == owner_of("tml-a")
    old = tokens.issue(owner_of("tml-a"), now=time.time() - 61)
    expired = refusal(checker, old)
    assert expired.status_code == 401 and "expired" in expired.detail
    assert expired.headers == {"WWW-Authenticate": 'Bearer error="invalid_token"'}  # the SDK re-exchanges


def test_a_token_checked_once_is_still_refused_once_it_expires() -> None:
    """Checked tokens are remembered (no HMAC per request), but only until their `exp`."""
    tokens = TokenIssuer(KEY, ttl_s=60)
    checker = KeyChecker(["tml-a"], None, tokens)
    token = tokens.issue(owner_of("tml-a"), now=time.time() - 58.5)  # expires 0.5-1.5 s from now
    assert checker.principal(token).owner == checker.principal(token).owner == owner_of("tml-a")
    expires = jwt.decode(token, KEY, algorithms=["HS256"], options={"verify_exp": False})["exp"]
    time.sleep(max(0.0, expires - time.time()) + 0.05)
    expired = refusal(checker, token)
    assert expired.status_code == 401 and "expired" in expired.detail


def test_forged_and_foreign_tokens_are_refused() -> None:
    tokens = TokenIssuer(KEY, ttl_s=60)
    checker = KeyChecker([], None, tokens)
    claims = jwt.decode(tokens.issue("someone"), KEY, algorithms=["HS256"])
    other_key = jwt.encode({**claims, "owner": "victim"}, b"x" * 32, algorithm="HS256")
    header, _, signature = tokens.issue("someone").split(".")
    body = base64.urlsafe_b64encode(json.dumps({**claims, "owner": "victim"}).encode()).decode().rstrip("=")
    unsigned = jwt.encode({**claims, "owner": "victim"}, None, algorithm="none")
    for forged in (other_key, f"{header}.{body}.{signature}", unsigned, "eyJnot-a-token"):
        refused = refusal(checker, forged)
        assert refused.status_code == 401 and refused.detail.startswith("invalid token"), forged


def test_a_token_dies_with_its_key() -> None:
    tokens = TokenIssuer(KEY, ttl_s=60)
    token = tokens.issue(owner_of("tml-a"))
    assert KeyChecker(["tml-a"], None, tokens).principal(token).owner == owner_of("tml-a")
    refused = refusal(KeyChecker(["tml-b"], None, tokens), token)  # restarted without tml-a
    assert refused.status_code == 401 and "no longer accepted" in refused.detail


def test_operator_keys_are_callers_and_their_tokens_stay_operators() -> None:
    tokens = TokenIssuer(KEY, ttl_s=60)
    checker = KeyChecker(["tml-a"], ["op-x"], tokens)
    assert checker.principal("op-x").operator and not checker.principal("tml-a").operator
    assert checker.principal(tokens.issue(owner_of("op-x"))).operator
    assert refusal(checker, "tml-unknown").status_code == 401


def test_without_token_exchange_a_token_is_not_a_key() -> None:
    token = TokenIssuer(KEY, ttl_s=60).issue(owner_of("tml-a"))
    assert "tml-" in refusal(KeyChecker([], None, None), token).detail


def test_the_exchange_is_a_clear_404_when_off(tmp_path) -> None:
    from fastapi.testclient import TestClient

    from tx.api.app import create_app
    from tx.config import Settings

    with TestClient(create_app(Settings(data_dir=tmp_path, jwt_auth=False)), base_url="http://localhost") as client:  # engines start lazily
        answer = client.post("/api/v1/auth/token", json={}, headers={"X-API-Key": "tml-a"})
    assert answer.status_code == 404 and "--jwt-auth" in answer.json()["detail"]
    token = TokenIssuer.from_data_dir(tmp_path, 60).issue("someone")
    assert (tmp_path / "jwt.key").stat().st_mode & 0o777 == 0o600
    assert TokenIssuer.from_data_dir(tmp_path, 60).owner(token) == "someone"  # the key outlives a restart


def test_a_token_renewed_with_a_token_ends_when_the_first_did(tmp_path) -> None:
    """A stolen token cannot be renewed past its own end without the key (the SDK renews with its key)."""

    from fastapi.testclient import TestClient

    from tx.api.app import create_app
    from tx.config import Settings

    with TestClient(create_app(Settings(data_dir=tmp_path, jwt_ttl_s=600)), base_url="http://localhost") as client:
        issued_before = time.time() - 300  # a token exchanged five minutes ago (the server's own key)
        first = TokenIssuer.from_data_dir(tmp_path, 600).issue(owner_of("tml-a"), now=issued_before)
        claims = jwt.decode(first, options={"verify_signature": False})
        renewed = client.post("/api/v1/auth/token", headers={"X-API-Key": first})
        assert renewed.status_code == 200, renewed.text
        again = jwt.decode(renewed.json()["jwt"], options={"verify_signature": False})
        assert again["exp"] == claims["exp"] and again["owner"] == claims["owner"]  # was: 5 minutes more
        by_key = jwt.decode(client.post("/api/v1/auth/token", headers={"X-API-Key": "tml-a"}).json()["jwt"],
                              options={"verify_signature": False})
        assert by_key["exp"] >= claims["exp"] + 299  # the key renews in full


def test_key_labels_by_owner_an_operator_reads_all_a_tenant_only_its_own() -> None:
    labels = labels_by_owner({"tml-a": "team a", owner_of("tml-b"): "team b"})
    assert labels == {owner_of("tml-a"): "team a", owner_of("tml-b"): "team b"}
    assert labels_seen(labels, Principal(owner_of("tml-op"), operator=True)) == labels
    assert labels_seen(labels, Principal(owner_of("tml-a"))) == {owner_of("tml-a"): "team a"}
    assert labels_seen(labels, Principal(owner_of("tml-c"))) == {}
