"""One stdlib logging setup shared by tx, uvicorn and engine processes."""

from __future__ import annotations

import logging
import os

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def init_logging(level: str | None = None) -> None:
    level = (level or os.environ.get("TX_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(level=level, format=FORMAT)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("uvicorn.access").setLevel(max(logging.getLevelName(level), logging.WARNING))


def uvicorn_log_config() -> None:
    """uvicorn must not install its own handlers; ours are already set."""
    return None
