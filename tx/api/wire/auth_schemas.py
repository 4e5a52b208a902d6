"""JSON bodies of `GET /api/v1/auth/apikey/me` (protocol §3.1 row 44), which `tinker auth login` reads."""

from __future__ import annotations

from tx.api.wire.schemas import WireResponse


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
