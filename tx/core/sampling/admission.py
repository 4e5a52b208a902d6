"""What a sample must pass before it holds anything, and the turn it then waits for.

At submission (`admit`, on the event loop, before a future exists): `num_samples` within the engines' batch,
images within the key's `images_per_request` quota and only for a model that takes images (so no asset pointer
is fetched for a text-only model), the server's queue (`max_queue` sequences, 429), and the key's
`samples_in_flight` quota (429). An admitted sample counts against both until it ends.

Then (`turn`) it waits at its base model's `SamplingGate` for engine capacity, shared between keys by fair share
of tokens; asset pointers are fetched only once it holds its turn.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from tx.core import quotas
from tx.core.fairshare import FairShare, tally
from tx.core.futures import Future
from tx.core.quotas import QuotaLimits
from tx.core.sampling.gate import SamplingGate
from tx.types import (
    MAX_SAMPLES_PER_REQUEST,
    AudioChunk,
    ImageAssetPointer,
    ImageChunk,
    OverloadedError,
    SampleRequest,
    TextChunk,
    UserError,
)


class SampleAdmission:
    def __init__(self, max_queue: int, limits: QuotaLimits | None = None, dispatch_rows: int = 64,
                 max_num_samples: int = MAX_SAMPLES_PER_REQUEST,
                 takes_images: Callable[[str], bool] | None = None) -> None:
        """`dispatch_rows`: sequences in flight at one base model's engines; `max_num_samples`: the engines' batch;
        `takes_images(base_model)`: whether that model reads images."""
        self.max_queue = max_queue
        self.limits = limits or QuotaLimits()
        self.dispatch_rows = dispatch_rows
        self.max_num_samples = max_num_samples
        self._takes_images = takes_images or (lambda _: True)
        self._fair = FairShare()  # one share per key over every base model's gate
        self._gates: dict[str, SamplingGate] = {}
        self._in_flight: dict[str, int] = {}  # key -> sequences admitted, not yet ended

    def admit(self, owner: str, base_model: str, request: SampleRequest) -> None:
        """Check a sample (see the module docstring) and count it; raises a 4xx error otherwise."""
        rows = request.num_samples
        if rows > self.max_num_samples:
            raise UserError(f"num_samples {rows} is over the engines' batch of {self.max_num_samples} sequences; "
                            "sample in several calls")
        images = sum(isinstance(chunk, (ImageChunk, ImageAssetPointer)) for chunk in request.prompt.chunks)
        frames = sum(chunk.length for chunk in request.prompt.chunks if isinstance(chunk, AudioChunk))
        quotas.check("audio_frames_per_request", 0, frames, self.limits.audio_frames_per_request)
        quotas.check("images_per_request", 0, images, self.limits.images_per_request)
        if images and not self._takes_images(base_model):
            raise UserError(f"model {base_model!r} takes text only: the prompt holds {images} image chunks "
                            "(nothing was fetched)")
        queued = sum(self._in_flight.values())
        if queued + rows > self.max_queue:
            raise OverloadedError(f"{queued} sequences are being sampled (the server's limit is {self.max_queue}); "
                                  "retry shortly")
        quotas.check("samples_in_flight", self._in_flight.get(owner, 0), rows, self.limits.samples_in_flight)
        tally(self._in_flight, owner, rows)

    def end(self, owner: str, request: SampleRequest) -> None:
        """An admitted sample ended (done, failed or cancelled)."""
        tally(self._in_flight, owner, -request.num_samples)

    @contextlib.asynccontextmanager
    async def turn(self, owner: str, base_model: str, request: SampleRequest,
                   future: Future | None = None) -> AsyncIterator[None]:
        """Hold engine capacity for an admitted sample (waiting for it by fair share)."""
        gate = self._gates.get(base_model)
        if gate is None:
            gate = self._gates[base_model] = SamplingGate(self.dispatch_rows, self._fair)
        rows = request.num_samples
        await gate.acquire(owner, rows, rows * (_prompt_tokens(request) + request.params.max_tokens), future)
        try:
            yield
        finally:
            gate.release(owner, rows)

    def in_flight(self) -> int:
        return sum(self._in_flight.values())

    def usage(self) -> dict[str, tuple[int, int]]:
        """{key: (sequences admitted and not ended, of which waiting at a gate)}; safe from another thread."""
        waiting: dict[str, int] = {}
        for gate in list(self._gates.values()):
            for owner, (_, rows) in gate.usage().items():
                waiting[owner] = waiting.get(owner, 0) + rows
        return {owner: (count, waiting.get(owner, 0)) for owner, count in dict(self._in_flight).items()}


def _prompt_tokens(request: SampleRequest) -> int:
    return sum(chunk.length if isinstance(chunk, TextChunk) else (chunk.expected_tokens or 0)
               for chunk in request.prompt.chunks)
