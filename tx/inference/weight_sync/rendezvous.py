"""The rendezvous store of a transfer group, behind a token: torch's TCPStore listens on every interface and
answers anyone, so tx never opens one.

- Rank 0 hosts a `StoreServer`: an in-memory c10d `HashStore` that rank 0 uses directly, served to the other
  ranks on a socket bound to the address the group names (the engines' private address; loopback when
  everything is local).
- The other ranks use a `RemoteStore`, a c10d `Store` (ProcessGroupGloo and ProcessGroupNCCL take one written
  in Python) that forwards each call to the server.
- Every connection starts with a challenge: the server sends a random nonce, the client answers
  HMAC-SHA256(token, nonce) and the server acknowledges it. A wrong answer, or none within `HANDSHAKE_S`,
  closes the connection before any store call. The token is new for every group and reaches the engines only inside the group's `TransferInit`,
  which tx sends over the engines' secret-guarded routes (the trainer workers get theirs over their private
  control channel): using the rendezvous takes the cluster secret.
- Bounds: `MAX_CLIENTS` connections at once, frames of at most `MAX_FRAME` bytes.

Frames are a 4-byte big-endian length and a JSON object; store values travel base64-encoded.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import secrets
import socket
import struct
import threading
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from tx.inference.weight_sync.types import WeightSyncError

HANDSHAKE_S = 5.0
MAX_CLIENTS = 64
MAX_FRAME = 1 << 20
_NONCE = 16
_ACCEPTED = b"\x01"
_LENGTH = struct.Struct(">I")


def new_token() -> str:
    return secrets.token_hex(32)


def _answer(token: str, nonce: bytes) -> bytes:
    return hmac.new(token.encode(), b"tx-rendezvous:" + nonce, hashlib.sha256).digest()


class StoreServer:
    """Rank 0's store: `store` for rank 0 itself, served on (`host`, `port`) to clients that know `token`."""

    def __init__(self, host: str, port: int, token: str, timeout: timedelta) -> None:
        self.store = dist.HashStore()  # pyright: ignore[reportPrivateImportUsage]  (torch re-exports it unmarked)
        self.store.set_timeout(timeout)
        self._token = token
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.create_server((host, port), family=family, backlog=MAX_CLIENTS)
        self.port: int = self._listener.getsockname()[1]
        self._clients: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=f"tx-rendezvous-{self.port}", daemon=True).start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            clients, self._clients = list(self._clients), set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for client in clients:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            client.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._closed or len(self._clients) >= MAX_CLIENTS:
                    conn.close()
                    continue
                self._clients.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(HANDSHAKE_S)
            nonce = secrets.token_bytes(_NONCE)
            conn.sendall(nonce)
            if not hmac.compare_digest(_recv_exact(conn, 32), _answer(self._token, nonce)):
                return
            conn.sendall(_ACCEPTED)
            conn.settimeout(None)  # calls may block (get, wait) up to the store's own timeout
            while True:
                request = _read_frame(conn)
                try:
                    reply = {"ok": True, **_apply(self.store, request)}
                except Exception as exc:  # noqa: BLE001 - the client raises it (e.g. a get that timed out)
                    reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
                _write_frame(conn, reply)
        except (OSError, ValueError, EOFError):
            pass
        finally:
            with self._lock:
                self._clients.discard(conn)
            conn.close()


def _apply(store: Any, request: dict[str, Any]) -> dict[str, Any]:
    op, key = request.get("op"), str(request.get("key", ""))
    if op == "set":
        store.set(key, _unb64(request["value"]))
        return {}
    if op == "get":
        return {"value": _b64(store.get(key))}
    if op == "add":
        return {"value": store.add(key, int(request["amount"]))}
    if op == "compare_set":
        return {"value": _b64(store.compare_set(key, _unb64(request["expected"]), _unb64(request["desired"])))}
    if op == "wait":
        keys = [str(k) for k in request["keys"]]
        store.wait(keys) if request.get("timeout_s") is None else store.wait(keys, timedelta(seconds=request["timeout_s"]))
        return {}
    if op == "check":
        return {"value": bool(store.check([str(k) for k in request["keys"]]))}
    if op == "delete_key":
        return {"value": bool(store.delete_key(key))}
    if op == "num_keys":
        return {"value": int(store.num_keys())}
    raise ValueError(f"unknown store op {op!r}")


class RemoteStore(dist.Store):  # pyright: ignore[reportPrivateImportUsage]
    """A c10d store whose calls go to a `StoreServer` (one authenticated connection per call in flight)."""

    def __init__(self, host: str, port: int, token: str, timeout: timedelta) -> None:
        super().__init__()
        self._address = (host, port)
        self._token = token
        self._timeout_s = timeout.total_seconds()
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._release(self._connect())  # fail now, naming the address, if the server cannot be reached

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def set(self, key: str, value: bytes | str) -> None:
        self._call({"op": "set", "key": key, "value": _b64(value)})

    def get(self, key: str) -> bytes:
        return _unb64(self._call({"op": "get", "key": key})["value"])

    def add(self, key: str, amount: int) -> int:
        return int(self._call({"op": "add", "key": key, "amount": int(amount)})["value"])

    def compare_set(self, key: str, expected: bytes | str, desired: bytes | str) -> bytes:
        reply = self._call({"op": "compare_set", "key": key, "expected": _b64(expected), "desired": _b64(desired)})
        return _unb64(reply["value"])

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._call({"op": "wait", "keys": list(keys), "timeout_s": None if timeout is None else timeout.total_seconds()})

    def check(self, keys: list[str]) -> bool:
        return bool(self._call({"op": "check", "keys": list(keys)})["value"])

    def delete_key(self, key: str) -> bool:
        return bool(self._call({"op": "delete_key", "key": key})["value"])

    def num_keys(self) -> int:
        return int(self._call({"op": "num_keys"})["value"])

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        conn = self._take()
        try:
            _write_frame(conn, request)
            reply = _read_frame(conn)
        except (OSError, ValueError, EOFError) as exc:
            conn.close()
            raise WeightSyncError(f"rendezvous store {self._where()}: {request.get('op')} failed: {exc}") from exc
        self._release(conn)
        if not reply.get("ok"):
            raise RuntimeError(f"rendezvous store {self._where()}: {reply.get('error')}")
        return reply

    def _take(self) -> socket.socket:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return self._connect()

    def _release(self, conn: socket.socket) -> None:
        with self._lock:
            self._idle.append(conn)

    def _connect(self) -> socket.socket:
        """An authenticated connection; a server not listening yet (rank 0 starts at the same time) is retried
        until the group's timeout, as torch's own store clients do."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                conn = socket.create_connection(self._address, timeout=max(0.1, deadline - time.monotonic()))
                break
            except ConnectionRefusedError as exc:
                if time.monotonic() >= deadline:
                    raise WeightSyncError(f"cannot reach the rendezvous store at {self._where()}: {exc}") from exc
                time.sleep(0.05)
            except OSError as exc:
                raise WeightSyncError(f"cannot reach the rendezvous store at {self._where()}: {exc}") from exc
        try:
            conn.settimeout(HANDSHAKE_S)
            conn.sendall(_answer(self._token, _recv_exact(conn, _NONCE)))
            if _recv_exact(conn, len(_ACCEPTED)) != _ACCEPTED:
                raise EOFError("no acceptance")
            conn.settimeout(None)
            return conn
        except (OSError, EOFError) as exc:
            conn.close()
            raise WeightSyncError(f"the rendezvous store at {self._where()} refused this rank: {exc}") from exc

    def _where(self) -> str:
        return f"{self._address[0]}:{self._address[1]}"


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    parts, left = [], size
    while left:
        part = conn.recv(left)
        if not part:
            raise EOFError("connection closed")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def _write_frame(conn: socket.socket, message: dict[str, Any]) -> None:
    body = json.dumps(message).encode()
    conn.sendall(_LENGTH.pack(len(body)) + body)


def _read_frame(conn: socket.socket) -> dict[str, Any]:
    (size,) = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is over {MAX_FRAME}")
    message = json.loads(_recv_exact(conn, size))
    if not isinstance(message, dict):
        raise ValueError("a frame must hold a JSON object")
    return message


def _b64(value: bytes | str) -> str:
    return base64.b64encode(value.encode() if isinstance(value, str) else bytes(value)).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)
