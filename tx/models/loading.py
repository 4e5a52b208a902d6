"""Progress of loading a model's weights into memory (docs/operations.md#models-from-the-hub).

`loading(model_dir)` wraps one load: while it runs, `in_progress()` lists it (the share of weights loaded, when
transformers says how many there are), `/api/v1/healthz` shows it, and the log gets a line every
`PROGRESS_EVERY_S`. The share is read off transformers' own "Loading weights" progress bar through its
`set_tqdm_hook` (transformers 5.23); where that hook is missing the load is still listed, without a share.
The terminal keeps transformers' bar as it was.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0
WEIGHTS_BAR = "Loading weights"  # transformers' bar over a model's weights (core_model_loading)


@dataclass
class Load:
    """One model being loaded: `done` of `total` weights (None until transformers' bar starts)."""

    model: str
    started: float  # time.time()
    done: int = 0
    total: int | None = None

    def fraction(self) -> float | None:
        return None if not self.total else min(self.done / self.total, 1.0)


_LOADS: dict[int, Load] = {}  # by the loading thread's id: transformers' bar runs on the thread that loads
_LOCK = threading.Lock()
_hooked = False


def in_progress() -> list[Load]:
    """The loads running in this process, oldest first."""
    with _LOCK:
        return sorted(_LOADS.values(), key=lambda load: load.started)


def model_name(model_dir: Path) -> str:
    """A hub cache directory (`.../models--Qwen--Qwen3-8B/snapshots/<commit>`) as `Qwen/Qwen3-8B`; any other
    directory by its own name (never its path: /api/v1/healthz answers without a key)."""
    found = re.search(r"models--([^/]+)--([^/]+)/snapshots/", f"{model_dir}/")
    return f"{found[1]}/{found[2]}" if found else Path(model_dir).name


@contextmanager
def loading(model_dir: Path) -> Iterator[Load]:
    """Track the load of `model_dir` run inside the block (on this thread)."""
    load = Load(model_name(model_dir), time.time())
    _hook_transformers()
    with _LOCK:
        _LOADS[threading.get_ident()] = load
    done = threading.Event()
    reporter = threading.Thread(target=_report, args=(load, done), name=f"loading {load.model}", daemon=True)
    reporter.start()
    try:
        yield load
    finally:
        done.set()
        reporter.join()
        with _LOCK:
            _LOADS.pop(threading.get_ident(), None)
    logger.info("loaded %s in %.1f s (%d weights)", load.model, time.time() - load.started, load.done)


def _report(load: Load, done: threading.Event) -> None:
    while not done.wait(PROGRESS_EVERY_S):
        share = load.fraction()
        logger.info("loading %s: %s, %.0f s", load.model,
                    f"{100 * share:.0f}% of {load.total} weights" if share is not None else "reading its files",
                    time.time() - load.started)


def _hook_transformers() -> None:
    """Put the counting hook in front of transformers' progress bars, once (keeping any hook set before)."""
    global _hooked
    with _LOCK:
        if _hooked:
            return
        _hooked = True
    try:
        from transformers.utils.logging import set_tqdm_hook
    except ImportError:  # an older transformers: loads are listed, without a share
        return
    previous: Callable[..., Any] | None = set_tqdm_hook(None)

    def hook(factory: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        bar = previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)
        load = _LOADS.get(threading.get_ident())
        if load is None or kwargs.get("desc") != WEIGHTS_BAR or not args:
            return bar
        load.total = len(args[0]) if hasattr(args[0], "__len__") else kwargs.get("total")
        return _Counted(bar, load)

    set_tqdm_hook(hook)


class _Counted:
    """A progress bar whose iteration also counts into a Load; everything else is the bar's."""

    def __init__(self, bar: Any, load: Load) -> None:
        self._bar = bar
        self._load = load

    def __iter__(self) -> Iterator[Any]:
        for item in self._bar:
            yield item
            self._load.done += 1

    def __enter__(self) -> Any:
        return self._bar.__enter__()

    def __exit__(self, *exc: object) -> Any:
        return self._bar.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bar, name)
