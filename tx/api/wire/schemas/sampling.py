"""Sampling sessions: create, look up and join; the asample body is in `asample.py`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tx.api.wire.schemas.base import WireRequest, WireResponse


class CreateSamplingSessionRequest(WireRequest):
    session_id: str
    sampling_session_seq_id: int
    base_model: str | None = None
    model_path: str | None = None
    type: Literal["create_sampling_session"] = "create_sampling_session"

    @model_validator(mode="after")
    def _has_a_model(self) -> CreateSamplingSessionRequest:
        if self.base_model is None and self.model_path is None:
            raise ValueError("send base_model or model_path")
        return self


class CreateSamplingSessionResponse(WireResponse):
    sampling_session_id: str
    type: Literal["create_sampling_session"] = "create_sampling_session"


class GetSamplerResponse(WireResponse):
    sampler_id: str
    base_model: str
    model_path: str | None = None


class JoinSamplingSessionRequest(WireRequest):
    sampling_session_id: str = Field(max_length=160)
    type: Literal["join_sampling_session"] = "join_sampling_session"


class JoinSamplingSessionResponse(WireResponse):
    client_counter: int = Field(description="the new client's number in the sampling session (the original is 0)")
    type: Literal["join_sampling_session"] = "join_sampling_session"
