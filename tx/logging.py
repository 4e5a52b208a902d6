"""One stdlib logging setup shared by tx, uvicorn and engine processes."""

from __future__ import annotations

import logging
import os

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def init_logging(level: str | None = None, process: str | None = None) -> None:
    """The one setup for every tx process; `process` names it in each line (e.g. "trainer-worker-1")."""
    level = (level or os.environ.get("TX_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(level=level, format=FORMAT if process is None else FORMAT.replace(
        "%(name)s", f"{process} %(name)s"))
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # huggingface_hub's client: two lines per model file fetched
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # seven "setup plugin" lines per start
    logging.getLogger("uvicorn.access").setLevel(max(logging.getLevelName(level), logging.WARNING))


def uvicorn_log_config() -> None:
    """uvicorn must not install its own handlers; ours are already set."""
    return None
