"""`python -m tx.inference.engines.embedded`: run one embedded engine; config from TX_ENGINE_CONFIG(_FILE).

Binds `host:port` (port 0 picks a free one), loads the model, serves HTTP from a thread while the main
thread runs the scheduler, and writes its URL to the config's `ready_file` once it serves. SIGTERM stops it
cleanly. Exits when its parent process goes away (unless `exit_with_parent` is false).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from tx.inference.engines.app import engine_app
from tx.inference.engines.embedded.config import EmbeddedEngineConfig
from tx.inference.engines.embedded.engine import EmbeddedEngine
from tx.inference.engines.kinds import EMBEDDED
from tx.inference.engines.serving import ReadyServer, bind
from tx.logging import init_logging

logger = logging.getLogger("tx.inference.engines.embedded")


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
    sock, url = bind(config.host, config.port)
    engine = EmbeddedEngine(config)
    server = ReadyServer(engine_app(engine, f"tx {EMBEDDED.label}"), config, url, EMBEDDED.label)
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
