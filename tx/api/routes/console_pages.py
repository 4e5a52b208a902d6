"""The web console's page and assets (`tx/console/`: our own HTML, CSS and JS, shipped in the package; no build
step, nothing from another host). Served at /console unless `console` is off; its JSON is `console.py`'s.

Every answer carries a Content-Security-Policy that lets the page load and call only this server: no other
host, no inline script or style, no frames.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

from tx.types import NotFoundError

ASSETS = Path(__file__).resolve().parents[2] / "console"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}
FOREVER = {**HEADERS, "Cache-Control": "public, max-age=31536000, immutable"}

router = APIRouter(include_in_schema=False)


@lru_cache(maxsize=None)
def asset(name: str) -> tuple[bytes, str]:
    """(bytes, media type) of one of the console's files; NotFoundError for anything else."""
    path = ASSETS / name
    if "/" in name or name.startswith(".") or path.suffix not in TYPES or not path.is_file():
        raise NotFoundError(f"no console asset {name!r}")
    return path.read_bytes(), TYPES[path.suffix]


@lru_cache(maxsize=1)
def version() -> str:
    """A digest of every asset: the page names its assets under it, so a browser keeps them until tx changes."""
    digest = hashlib.sha256()
    for path in sorted(ASSETS.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


@router.get("/console")
async def page() -> Response:
    body, media_type = asset("index.html")
    return Response(body.replace(b"__VERSION__", version().encode()), media_type=media_type, headers=HEADERS)


@router.get("/console/")
async def page_slash() -> Response:
    return RedirectResponse("/console", status_code=308)


@router.get("/console/assets/{tag}/{name}")
async def assets(tag: str, name: str) -> Response:
    """An asset; cached for good when asked for under the current version (a page from an older tx gets today's
    files, uncached)."""
    body, media_type = asset(name)
    return Response(body, media_type=media_type, headers=FOREVER if tag == version() else HEADERS)
