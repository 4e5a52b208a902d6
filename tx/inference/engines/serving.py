"""Serving an engine's app from the engine's own process (each kind's `__main__`): the listening socket,
bound before the slow start so the port is the engine's, and a uvicorn server that writes the ready file
(`engines/config.py`) once it serves. Signals are the engine's `main` to handle, never uvicorn's.
"""

from __future__ import annotations

import contextlib
import logging
import socket

import uvicorn
from fastapi import FastAPI

from tx.inference.engines.config import EngineProcessConfig, write_ready_file

logger = logging.getLogger(__name__)


def bind(host: str, port: int) -> tuple[socket.socket, str]:
    """A listening socket on `host:port` (port 0 picks a free one) and its URL.

    Its connections send at once (TCP_NODELAY, which accepted sockets take from the listener). uvicorn writes an
    answer's head and body apart; under Nagle's rule the body waited for the client's delayed ACK of the head,
    ~40 ms on every engine answer. asyncio turns Nagle off only on sockets made with IPPROTO_TCP, as uvicorn's
    own binding makes them, not on one made with protocol 0 (docs/engines.md#the-engine-process)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(128)
    bound_host, bound_port = sock.getsockname()[:2]
    url = f"http://[{bound_host}]:{bound_port}" if ":" in bound_host else f"http://{bound_host}:{bound_port}"
    return sock, url


class ReadyServer(uvicorn.Server):
    """Serves `app`; writes the ready file once the socket is served."""

    def __init__(self, app: FastAPI, config: EngineProcessConfig, url: str, label: str) -> None:
        super().__init__(uvicorn.Config(app, log_level=config.log_level, access_log=False))
        self.engine_config, self.url, self.label = config, url, label

    @contextlib.contextmanager
    def capture_signals(self):
        """uvicorn would re-raise SIGTERM after serving, killing the process before it cleans up (stops vLLM);
        each engine's `main` installs handlers that stop it in order."""
        yield

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.engine_config.ready_file is not None:
            write_ready_file(self.engine_config.ready_file, self.url)
        logger.info("%s serving at %s", self.label, self.url)


__all__ = ["ReadyServer", "bind"]
