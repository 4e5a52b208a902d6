"""Who calls: the token exchange (`auth/token`, JWT mode) and the calling key's facts (`auth/apikey/me`)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Request

from tx.api.auth import TokenIssuer, credential_of
from tx.api.deps import Caller, Ctx
from tx.api.errors import COMMON_ERRORS, error_responses
from tx.api.wire.schemas.identity import (
    AuthTokenResponse,
    KeyDetails,
    OrgDetails,
    SelfApiKeyResponse,
    UserDetails,
)

router = APIRouter(tags=["auth"], responses=COMMON_ERRORS)
ORG_NAME = "tx"  # tx has no organisations: every key is its own tenant


@router.post("/auth/token", responses=error_responses(404))
async def auth_token(request: Request, ctx: Ctx, caller: Caller) -> AuthTokenResponse:
    """A token for the caller's key, valid for --jwt-ttl-s; for a token presented, one that ends when it does."""
    tokens: TokenIssuer | None = request.app.state.key_checker.tokens
    if tokens is None:
        raise HTTPException(404, "token exchange is off on this server (tx serve --jwt-auth turns it on); "
                                 "send your API key on every request")
    presented = credential_of(request)  # a token renewed with a token ends when it would have (not the key)
    token = tokens.issue(caller.owner, expires_by=tokens.expiry(presented) if presented.startswith("eyJ") else None)
    await asyncio.to_thread(ctx.audit.record, "key_token_issue", caller.owner, ttl_seconds=tokens.ttl_s)
    return AuthTokenResponse(jwt=token)


@router.get("/auth/apikey/me")
async def my_key(caller: Caller) -> SelfApiKeyResponse:
    name = f"tx key {caller.owner[:12]}" + (" (operator)" if caller.operator else "")
    details = KeyDetails(org_details=OrgDetails(name=ORG_NAME), user_details=UserDetails(email=""))
    return SelfApiKeyResponse(key_id=int(caller.owner[:12], 16), name=name, note="", details=details)


@router.delete("/auth/apikey/me", responses=error_responses(403))
async def delete_my_key(_: Caller) -> None:
    raise HTTPException(403, "tx's API keys are set by the server's operator (--api-key / TX_API_KEYS): "
                             "ask them to remove this one")
