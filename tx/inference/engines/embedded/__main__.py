"""`python -m tx.inference.engines.embedded`: run one embedded engine; config from TX_ENGINE_CONFIG(_FILE).

Binds `host:port` (port 0 picks a free one), loads the model, serves HTTP from a thread while the main
thread runs the scheduler, and writes its URL to the config's `ready_file` once it serves. SIGTERM stops it
cleanly. Exits when its parent process goes away (unless `exit_with_parent` is false).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

import uvicorn

from tx.inference.engines.embedded.app import create_app
from tx.inference.engines.embedded.config import EmbeddedEngineConfig, write_ready_file
from tx.inference.engines.embedded.engine import EmbeddedEngine
from tx.logging import init_logging

logger = logging.getLogger("tx.inference.engines.embedded")


class _Server(uvicorn.Server):
    """Writes the ready file once the socket is served."""

    def __init__(self, config: uvicorn.Config, engine_config: EmbeddedEngineConfig, url: str) -> None:
        super().__init__(config)
        self.engine_config = engine_config
        self.url = url

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started and self.engine_config.ready_file is not None:
            write_ready_file(self.engine_config.ready_file, self.url)
        logger.info("engine serving at %s", self.url)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def _exit_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        logger.warning("parent process %d went away; exiting", parent)
        os._exit(1)

    threading.Thread(target=watch, name="tx-engine-parent-watch", daemon=True).start()


def main(config: EmbeddedEngineConfig | None = None) -> None:
    """Serve one engine: `config`, or the one in the environment (as tx's launchers hand it over)."""
    config = config or EmbeddedEngineConfig.from_env()
    init_logging(config.log_level)
    if config.exit_with_parent:
        _exit_with_parent()
    sock = _bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    engine = EmbeddedEngine(config)
    uv_config = uvicorn.Config(create_app(engine), log_level=config.log_level, access_log=False)
    server = _Server(uv_config, config, url)
    serving = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="tx-engine-http")
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: engine.scheduler.stop())
    serving.start()
    try:
        engine.scheduler.run()  # the main thread computes; HTTP is served from `serving`
    finally:
        server.should_exit = True
        serving.join(timeout=10)
        engine.close()


if __name__ == "__main__":
    main()
