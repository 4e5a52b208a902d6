"""What `tx serve` checks before it binds, so that a refusal at start is one line naming the cause and the fix
(docs/operations.md#start-up-errors): the data directory, the port, the store's schema, then the base models,
downloaded when absent (the server is not up, and `/api/v1/healthz` does not answer, until they are all here;
so the SDK's create_model never waits on a download).

Each check raises `StartupRefused`; `tx serve` prints its message and exits with status 2 (a traceback only with
`--debug`).
"""

from __future__ import annotations

import errno
import socket
from pathlib import Path

from tx.config import Settings, make_private_dir
from tx.models.serve import resolve_served_models
from tx.store.migrate import SchemaTooNewError
from tx.store.store import Store
from tx.types import NotFoundError


class StartupRefused(Exception):
    """A reason not to start; the message is one line: the cause and the fix."""


def preflight(settings: Settings) -> dict[str, Path]:
    """Every check of the module docstring, in order; the served models (name -> directory) when all pass."""
    check_data_dir(settings.data_dir)
    check_port_free(settings.host, settings.port, "--port")
    check_store(settings.store_url)
    try:
        return resolve_served_models(settings)
    except NotFoundError as exc:
        raise StartupRefused(str(exc)) from exc


def check_data_dir(data_dir: Path) -> None:
    """The data directory exists (made private) and takes a file."""
    try:
        make_private_dir(data_dir)
        probe = data_dir / ".tx-write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise StartupRefused(f"cannot use the data directory {data_dir} ({exc.strerror or exc}): choose another "
                             "with --data-dir (or TX_DATA_DIR), or make it writable by this user") from exc


def check_port_free(host: str, port: int, flag: str) -> None:
    """Binding `host:port` works now (port 0 always does). A later bind can still lose a race; this catches the
    common case, a server already there, before minutes of loading models."""
    if port == 0:
        return
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            s.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise StartupRefused(f"port {port} on {host} is in use (another tx serve?): stop what holds it, or "
                                 f"choose another with {flag} (0 picks a free one)") from exc
        raise StartupRefused(f"cannot bind {host}:{port} ({exc.strerror or exc}): give an address of this machine "
                             "with --host") from exc


def check_store(url: str) -> None:
    """The store opens and its schema is one this tx knows (migrated to the newest if older)."""
    try:
        Store.from_url(url).close()
    except SchemaTooNewError as exc:
        raise StartupRefused(f"{exc}, or start with another --data-dir or --database-url") from exc
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StartupRefused(f"cannot open the store ({first}): check --database-url, or start with another "
                             "--data-dir") from exc


__all__ = ["StartupRefused", "check_data_dir", "check_port_free", "check_store", "preflight"]
