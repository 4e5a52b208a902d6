"""Futures: retrieve, the batch long-poll, cancel, and the answers they carry."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tx.api.wire.schemas.base import WireRequest, WireResponse
from tx.types import ErrorCategory


class RetrieveFutureRequest(WireRequest):
    request_id: str
    allow_metadata_only: bool = False


class CancelFutureRequest(WireRequest):
    request_id: str


class SamplingSessionFuturesTarget(WireRequest):
    type: Literal["sampling_session"] = "sampling_session"
    sampling_session_id: str
    cloned_sampler_id: int = Field(0, ge=0)


class FuturesRetrieveRequest(WireRequest):
    """POST /api/v1/retrieve_futures: timeout 0 = answer at once (an ack), null = long-poll."""

    target: SamplingSessionFuturesTarget
    prev_cursor: int = Field(0, ge=0)
    timeout: float | None = Field(None, ge=0)
    retrieved_request_ids: list[str] = Field(default_factory=list, max_length=10_000)


class FutureCompletion(WireResponse):
    state: Literal["finished", "failed"]
    request_id: str
    response_payload_uncompressed_size: int | None = None


class FuturesRetrieveResponse(WireResponse):
    completions: list[FutureCompletion]
    cursor: int


class UntypedAPIFuture(WireResponse):
    """The immediate answer to every async operation; asample must fill sample_sequence_ids."""

    request_id: str
    model_id: str | None = None
    sample_sequence_ids: list[str] | None = None


QueueState = Literal["active", "paused_capacity", "paused_rate_limit"]


class TryAgainResponse(WireResponse):
    request_id: str
    queue_state: QueueState = "active"
    queue_state_reason: str | None = None
    type: Literal["try_again"] = "try_again"


class RequestFailedResponse(WireResponse):
    error: str
    category: ErrorCategory
