"""`python -m tx.inference.engines.embedded`: run one embedded engine; config from TX_ENGINE_CONFIG(_FILE).

Binds `host:port` (port 0 picks a free one), loads the model, serves HTTP from a thread while the main
thread runs the scheduler, and writes its URL to the config's `ready_file` once it serves. SIGTERM stops it
cleanly. Exits when its parent process goes away (unless `exit_with_parent` is false).

In standby (`STANDBY_ENV` set, `tx/inference/launch/standby.py` starts it): it imports what serving needs (torch,
transformers, PEFT, the served models' classes, tokenizers: `prebuilt.py`), then waits for its config as one JSON line on stdin, and only
then loads a model; stdin closed without a line (tx serve stopped, or never needed an engine) ends it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from tx.inference.engines.app import engine_app
from tx.inference.engines.config import STANDBY_ENV, STANDBY_MODELS_ENV
from tx.inference.engines.embedded.config import EmbeddedEngineConfig
from tx.inference.engines.embedded.engine import EmbeddedEngine
from tx.inference.engines.embedded.prebuilt import prebuild
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


def standby() -> EmbeddedEngineConfig | None:
    """Import ahead, then the config from stdin (None: stdin closed first)."""
    import peft.tuners.lora  # noqa: F401 - imported now, used at the first adapter
    import transformers
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    model_dirs = [Path(d) for d in os.environ.get(STANDBY_MODELS_ENV, "").split(os.pathsep) if d]
    for model_dir in model_dirs:
        try:  # the served models' classes, and the loader's tables (~700 regexes, built at the first load)
            config = transformers.AutoConfig.from_pretrained(model_dir)
            for name in config.architectures or ():
                getattr(transformers, name, None)
            get_checkpoint_conversion_mapping(config.model_type)
        except Exception:  # noqa: BLE001 - a warm-up only: the real load reports any problem
            logger.debug("standby: nothing warmed up for %s", model_dir, exc_info=True)
    prebuild(model_dirs)  # their tokenizers, the HTTP server's classes: taken by the engine (prebuilt.py)
    line = sys.stdin.readline()
    return EmbeddedEngineConfig.model_validate_json(line) if line.strip() else None


if __name__ == "__main__":
    if os.environ.get(STANDBY_ENV):
        if (handed := standby()) is not None:
            main(handed)
    else:
        main()
