"""The `Launcher` seam: what starts one engine and the handle it gives back.

A launcher starts one engine (any engine serving `tx/inference/protocol/`) for a model directory and hands
back an `EngineHandle`: a URL the manager talks to, and whether it is still alive. The manager and its
supervisor know engines only through these two protocols.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class EngineHandle(Protocol):
    name: str
    url: str

    @property
    def alive(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...


class Launcher(Protocol):
    secret: str

    async def start(self, name: str, model_dir: Path) -> EngineHandle: ...

    async def stop(self, engine: EngineHandle) -> None: ...

    async def close(self) -> None: ...
