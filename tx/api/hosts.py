"""Which `Host` headers the API answers: the defence against DNS rebinding.

A web page can make its own name resolve to 127.0.0.1 and then talk to a local tx as a page of its own
origin, through the user's browser. Without API keys a local tx takes any `tml-` key, so such a page could
train, sample and read. Its requests still carry the page's name in `Host`; the server answers only the
names it is reached at (docs/security.md#local-servers-and-dns-rebinding):

- a server bound to loopback answers `localhost`, `127.0.0.1`, `[::1]`, its bound address, the host of
  `--public-url` and each `--allowed-host`;
- a server bound elsewhere (API keys are required there) checks only when `--allowed-host` names are given:
  then those, its bound address, the loopback names and `--public-url`'s host;
- `--allowed-host '*'` turns the check off.

Any other `Host` gets a 421 that says which flag allows it. `/healthz` answers every `Host`: it tells nothing,
and probes reach it by whatever address they hold. Starlette's TrustedHostMiddleware is not used: it splits
the port off at the first colon, so it cannot read `[::1]:8000`, and it answers in plain text.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.responses import JSONResponse

from tx.api.limits import ASGIApp, Receive, Scope, Send
from tx.config import Settings, is_loopback

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
UNCHECKED_PATHS = frozenset({"/api/v1/healthz"})


def host_name(header: str) -> str:
    """The name in a `Host` header, without its port, brackets or trailing dot, in lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        name = header[1:].partition("]")[0]
    else:
        name = header.rpartition(":")[0] if header.count(":") == 1 else header
    return name.rstrip(".")


def allowed_host_names(settings: Settings) -> frozenset[str] | None:
    """The names this server answers, or None when it answers any (see the module's docstring)."""
    given = {host_name(name) for name in settings.allowed_hosts}
    if "*" in given:
        return None
    if not given and not is_loopback(settings.host):
        return None
    names = LOOPBACK_NAMES | given | {host_name(settings.host)}
    if settings.public_url:
        names |= {host_name(urlsplit(settings.public_url).netloc)}
    return frozenset(names)


class HostCheck:
    """ASGI middleware: a 421 for a request whose `Host` is not a name this server answers."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]) -> None:
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in UNCHECKED_PATHS:
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            name = host_name(header)
            if name not in self.allowed:
                await misdirected(name)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def misdirected(name: str) -> JSONResponse:
    shown = name[:200] or "(none)"
    return JSONResponse(
        {"detail": f"this server does not answer the host {shown!r}: reach it as localhost or by its address, "
                   "or start it with --allowed-host NAME (TX_ALLOWED_HOSTS) for a name of your own"},
        status_code=421,
    )
