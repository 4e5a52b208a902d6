"""A STAND-IN for the Hugging Face hub, on 127.0.0.1, for tests: the hub itself is not reachable from CI.

It serves model directories (a tiny model written by `tx models make-tiny --out`) through the part of the hub's
HTTP API that huggingface_hub's `model_info` and `snapshot_download` use, so tx's own download code runs
unchanged against it with `HF_ENDPOINT` pointed here:

- `GET /api/models/{repo}/revision/{rev}` (and `/api/models/{repo}`, main): the repository's commit and its
  files (`siblings`) with sizes;
- `GET /api/models/{repo}/tree/{rev}`: the file listing huggingface_hub caches (one page);
- `HEAD`/`GET /{repo}/resolve/{rev}/{file}`: the file, with `ETag`, `X-Repo-Commit`, `Content-Length` and
  `Range` requests (206, `Content-Range`).

As the real hub: an unknown repository is a 404 `RepoNotFound`, an unknown revision a 404 `RevisionNotFound`,
and a gated repository lists its files to anyone but answers its files (`resolve`) with 401 `GatedRepo` unless
the request carries the token it was given. `cut_once` names files whose first full GET is cut off halfway (the
connection closed mid-body), to test resuming; `failing` names files whose GET answers 500; `requests` records
every (method, path, Range header).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self
from urllib.parse import unquote, urlparse


@dataclass
class Repo:
    commits: dict[str, Path]  # commit (40 hex) -> directory of its files
    branches: dict[str, str]  # branch -> commit
    token: str | None = None  # gated: the token its files need

    def commit_of(self, revision: str) -> str | None:
        revision = unquote(revision)
        return self.branches.get(revision) or (revision if revision in self.commits else None)


@dataclass
class HubStandIn:
    repos: dict[str, Repo] = field(default_factory=dict)
    cut_once: set[str] = field(default_factory=set)
    failing: set[str] = field(default_factory=set)  # files whose GET answers 500 (an outage) while named here
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    bytes_per_s: float | None = None  # throttle file bodies (progress tests)
    _server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, repo_id: str, directory: Path, token: str | None = None, branch: str = "main") -> str:
        """Serve `directory` as a new commit of `repo_id` on `branch`; returns the commit."""
        commit = hashlib.sha1(f"{repo_id}:{directory}".encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, Repo({}, {}, token))
        repo.commits[commit] = directory
        repo.branches[branch] = commit
        return commit

    def __enter__(self) -> Self:
        standin = self

        class Handler(_Handler):
            hub = standin

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    def file_gets(self, name: str) -> list[str | None]:
        """The Range header of every GET of file `name`."""
        return [rng for method, path, rng in self.requests if method == "GET" and path.endswith(f"/{name}")]


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn

    def log_message(self, *_args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, body: bool) -> None:
        path = unquote(urlparse(self.path).path)
        self.hub.requests.append((self.command, path, self.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) == 4:  # model_info without a revision: main
            self._api(f"{parts[2]}/{parts[3]}", "revision", "main")
        elif parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            self._api(f"{parts[2]}/{parts[3]}", parts[4], parts[5])
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), body)
        else:
            self._error(404, "EntryNotFound", f"no route {path}")

    def _lookup(self, repo_id: str, revision: str) -> tuple[Repo, str] | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}.")
            return None
        commit = repo.commit_of(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo, commit

    def _api(self, repo_id: str, kind: str, revision: str) -> None:
        found = self._lookup(repo_id, revision)
        if found is None:
            return
        repo, commit = found
        files = sorted(p for p in repo.commits[commit].iterdir() if p.is_file())
        if kind == "tree":
            body = [{"type": "file", "path": p.name, "size": p.stat().st_size,
                     "oid": hashlib.sha1(p.read_bytes()).hexdigest()} for p in files]
        else:
            body = {"id": repo_id, "modelId": repo_id, "sha": commit, "private": False,
                    "gated": "manual" if repo.token else False, "tags": [], "downloads": 0, "likes": 0,
                    "siblings": [{"rfilename": p.name, "size": p.stat().st_size} for p in files]}
        self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _file(self, repo_id: str, revision: str, name: str, body: bool) -> None:
        found = self._lookup(repo_id, revision)
        if found is None:
            return
        repo, commit = found
        if repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it "
                        "and be authenticated to access it. Please log in.")
            return
        path = repo.commits[commit] / name
        if not path.is_file():
            self._error(404, "EntryNotFound", f"{name} does not exist")
            return
        data = path.read_bytes()
        headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": commit,
                   "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        start = _range_start(self.headers.get("Range"))
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        status = 206 if start else 200
        if not body:
            self._send(status, b"", {**headers, "Content-Length": str(len(data) - start)}, head=True)
        elif name in self.hub.failing:
            self._error(500, "InternalError", "the stand-in hub fails this file on purpose")
        elif start == 0 and name in self.hub.cut_once:
            self.hub.cut_once.discard(name)
            self._send(200, data[: len(data) // 2], {**headers, "Content-Length": str(len(data))})
            self.close_connection = True
        else:
            self._send(status, data[start:], headers)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode(),
                   {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message})

    def _send(self, status: int, data: bytes, headers: dict[str, str], head: bool = False) -> None:
        self.send_response(status)
        headers.setdefault("Content-Length", str(len(data)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if head:
            return
        rate = self.hub.bytes_per_s
        step = max(int(rate / 10), 1) if rate else len(data) or 1
        for offset in range(0, len(data), step):
            self.wfile.write(data[offset: offset + step])
            if rate:
                time.sleep(step / rate)


def _range_start(header: str | None) -> int:
    """The start of a `bytes=N-` Range (0 without one)."""
    if not header or not header.startswith("bytes="):
        return 0
    return int(header[len("bytes="):].split("-")[0] or 0)
