"""The engine's listening socket (`engines/serving.py: bind`) hands out connections that send at once.

Without TCP_NODELAY, uvicorn's answer (its head and body written apart) waited ~40 ms for the client's delayed
ACK on every engine call (docs/engines.md#the-engine-process). Checked on a connection the listener accepts:
uvicorn's transport writes on such a connection."""

from __future__ import annotations

import socket

from tx.inference.engines.serving import bind


def test_connections_accepted_by_the_engines_listener_have_nagle_off() -> None:
    listener, url = bind("127.0.0.1", 0)
    with listener, socket.create_connection(listener.getsockname()[:2]):
        accepted, _ = listener.accept()
        with accepted:
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert url.startswith("http://127.0.0.1:")
