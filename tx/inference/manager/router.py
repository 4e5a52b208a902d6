"""Sticky routing: a consistent hash of a key picks the engine, skipping dead ones.

The manager routes on the sampler id (`EngineGroup.pick`), so every request of one sampling client goes to
one engine (its prefix cache, its loaded adapter) while different samplers spread over the engines; when an
engine leaves or comes back, only the samplers homed on it move.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence

VIRTUAL_NODES = 64


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class Router:
    def __init__(self, engines: Sequence[str]) -> None:
        """`engines` are stable engine names (not URLs: a restarted engine keeps its place)."""
        if not engines:
            raise ValueError("a router needs at least one engine")
        self.engines = list(engines)
        points = [(_hash(f"{name}#{i}"), name) for name in self.engines for i in range(VIRTUAL_NODES)]
        points.sort()
        self._keys = [p[0] for p in points]
        self._names = [p[1] for p in points]

    def order(self, session_key: str) -> list[str]:
        """Every engine, in the order to try them for this key (first = its home engine)."""
        start = bisect.bisect(self._keys, _hash(session_key)) % len(self._keys)
        seen: dict[str, None] = {}
        for i in range(len(self._names)):
            seen.setdefault(self._names[(start + i) % len(self._names)])
            if len(seen) == len(self.engines):
                break
        return list(seen)

    def pick(self, session_key: str, alive: Iterable[str] | None = None) -> str:
        """The first engine for this key that is alive."""
        alive_set = set(self.engines if alive is None else alive)
        for name in self.order(session_key):
            if name in alive_set:
                return name
        raise LookupError("no engine is alive")
