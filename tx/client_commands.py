"""The `tx checkpoints` commands that talk to a running server as a user, with the key in `TINKER_API_KEY`, at
`TINKER_BASE_URL` (as the SDK does): `import` (an adapter trained elsewhere, `tx/api/routes/imports.py`), `merge`
(a checkpoint merged into its base model on the server, `tx/api/routes/merges.py`) and `prune` (the caller's
checkpoints by run or age, shown and confirmed before any is deleted). They speak the
server's HTTP routes, so they need neither the SDK nor the server's data directory."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx

from tx.types import UserError

DEFAULT_URL = "http://127.0.0.1:8000"
DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
PAGE = 1000


def server_client(url: str | None, timeout_s: float = 120) -> httpx.Client:
    """An HTTP client of the server at `url` (else $TINKER_BASE_URL, else loopback) with the caller's key."""
    key = os.environ.get("TINKER_API_KEY")
    if not key:
        raise UserError("set TINKER_API_KEY to your key for this server")
    base = (url or os.environ.get("TINKER_BASE_URL") or DEFAULT_URL).rstrip("/")
    return httpx.Client(base_url=base, headers={"X-API-Key": key}, timeout=timeout_s)


def answer_of(response: httpx.Response) -> dict[str, Any]:
    """The JSON body of a successful answer; UserError with the server's own words otherwise."""
    body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
    if not response.is_success:
        said = body.get("detail") if isinstance(body, dict) else None
        raise UserError(f"the server answered {response.status_code}: {said or response.text[:500]}")
    return body


# ---- import ----

def import_adapter(directory: Path, base_model: str, name: str | None, project_id: str | None,
                   url: str | None) -> str:
    """The tinker path of the adapter in `directory`, imported into the caller's checkpoints."""
    from tx.backends.adapter_import import upload_of

    name = name or re.sub(r"[^A-Za-z0-9._-]+", "-", directory.resolve().name).lstrip("._-")[:200] or "imported"
    body = upload_of(directory)
    params = {"base_model": base_model, "name": name, **({"project_id": project_id} if project_id else {})}
    with server_client(url) as client:
        future = answer_of(client.post("/api/v1/tx/checkpoints/import", params=params, content=body,
                                       headers={"Content-Type": "application/octet-stream"}))
        result = wait_for(client, future["request_id"])
    return str(result["path"])


def wait_for(client: httpx.Client, request_id: str) -> dict[str, Any]:
    """A future's result, polled as the SDK polls it; UserError with the server's reason when it failed."""
    while True:
        result = answer_of(client.post("/api/v1/retrieve_future", json={"request_id": request_id}))
        if "error" in result and "category" in result:  # RequestFailedResponse
            raise UserError(str(result["error"]))
        if result.get("type") != "try_again":
            return result


# ---- merge ----

def merge_checkpoint(source: str, name: str, ttl_s: int | None, url: str | None) -> tuple[str, int]:
    """(path, bytes) of `source` merged into its base model on the server, as external_weights/<name>."""
    body: dict[str, Any] = {"source_path": source, "name": name, "ttl_seconds": ttl_s}
    with server_client(url) as client:
        future = answer_of(client.post("/api/v1/tx/checkpoints/merge", json=body))
        result = wait_for(client, future["request_id"])
    return str(result["path"]), int(result.get("size_bytes") or 0)


# ---- prune ----

@dataclass(frozen=True)
class Listed:
    tinker_path: str
    size_bytes: int
    created_at: datetime

    @property
    def route(self) -> str:
        run_id, checkpoint_id = self.tinker_path.removeprefix("tinker://").split("/", 1)
        return f"/api/v1/training_runs/{run_id}/checkpoints/{checkpoint_id}"


def parse_age(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `2w`, `45s` as a duration."""
    match = DURATION.match(text.strip())
    if match is None:
        raise UserError(f"--older-than takes a number and a unit (s, m, h, d, w), like 30d; got {text!r}")
    return timedelta(seconds=float(match.group(1)) * SECONDS[match.group(2)])


def prunable(client: httpx.Client, runs: list[str], older_than: timedelta | None, kinds: list[str]
             ) -> list[Listed]:
    """The caller's checkpoints of `runs` (any run when empty), created before now - `older_than` (any age when
    None), of `kinds` (any when empty), oldest first."""
    if not runs and older_than is None:
        raise UserError("say what to prune: --run RUN_ID and/or --older-than AGE (prune never takes everything)")
    cutoff = datetime.now(timezone.utc) - older_than if older_than is not None else None
    chosen = [
        c for c in _every_checkpoint(client)
        if (not runs or c["tinker_path"].removeprefix("tinker://").split("/", 1)[0] in runs)
        and (not kinds or c["checkpoint_id"].split("/", 1)[0] in kinds)
        and (cutoff is None or _when(c["time"]) < cutoff)
    ]
    listed = [Listed(c["tinker_path"], int(c.get("size_bytes") or 0), _when(c["time"])) for c in chosen]
    return sorted(listed, key=lambda c: c.created_at)


def _every_checkpoint(client: httpx.Client) -> Iterator[dict[str, Any]]:
    offset = 0
    while True:
        page = answer_of(client.get("/api/v1/checkpoints", params={"limit": PAGE, "offset": offset}))
        yield from page["checkpoints"]
        offset += len(page["checkpoints"])
        if not page["checkpoints"] or offset >= page["cursor"]["total_count"]:
            return


def _when(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def prune(runs: list[str], older_than: str | None, kinds: list[str], yes: bool, url: str | None,
          confirm: Callable[[str], bool]) -> tuple[int, int]:
    """(checkpoints deleted, their bytes), after showing them and asking `confirm` unless `yes`."""
    with server_client(url) as client:
        doomed = prunable(client, runs, parse_age(older_than) if older_than else None, kinds)
        if not doomed:
            print("no checkpoint matches; nothing deleted")
            return 0, 0
        total = sum(c.size_bytes for c in doomed)
        for c in doomed:
            print(f"  {c.tinker_path}  {c.size_bytes / 2**20:,.1f} MiB  {c.created_at:%Y-%m-%d %H:%M} UTC")
        question = f"delete these {len(doomed)} checkpoints ({total / 2**20:,.1f} MiB)?"
        if not yes and not confirm(question):
            print("nothing deleted")
            return 0, 0
        for c in doomed:  # one by one, each recorded in the audit log as checkpoint_delete
            answer_of(client.delete(c.route))
        print(f"deleted {len(doomed)} checkpoints, {total / 2**20:,.1f} MiB")
        return len(doomed), total


def ask(question: str) -> bool:
    """y/N on the terminal; refused (UserError) when there is no terminal to ask on."""
    if not sys.stdin.isatty():
        raise UserError("prune asks before deleting, and there is no terminal to ask on: pass --yes")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
