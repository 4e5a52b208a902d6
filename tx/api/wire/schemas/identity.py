"""Who calls: the token exchange (`POST /api/v1/auth/token`, JWT mode) and `GET /api/v1/auth/apikey/me`, which
`tinker auth login` reads."""

from __future__ import annotations

from tx.api.wire.schemas.base import WireResponse


class AuthTokenResponse(WireResponse):
    jwt: str


class OrgDetails(WireResponse):
    name: str


class UserDetails(WireResponse):
    email: str


class KeyDetails(WireResponse):
    org_details: OrgDetails
    user_details: UserDetails


class SelfApiKeyResponse(WireResponse):
    """The calling key's public facts. tx's keys have no name, note or email: the name is tx's own
    label for the key's tenant, and the email is empty."""

    key_id: int
    name: str
    note: str
    details: KeyDetails
