"""The stream route's lines (`ROUTE_GENERATE_STREAM`): the same request as `/generate`, answered as NDJSON, one
`GenerateEvent` per line: tokens as they are generated, then the whole answer. docs/engines.md#generate."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tx.inference.protocol import GenerateResponse


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TokenDelta(_Wire):
    """Tokens sample `index` generated since the previous event, with their raw logprobs."""

    index: int
    token_ids: list[int]
    logprobs: list[float]


class GenerateEvent(_Wire):
    """One line of the stream route: tokens as they are generated, then the whole answer (the same as
    `/generate`'s, so it is complete whatever deltas a reader skipped), or an error (`status`, `detail`) once the
    stream started."""

    deltas: list[TokenDelta] = Field(default_factory=list)
    result: GenerateResponse | None = None
    error_status: int | None = None
    error_detail: str | None = None


