"""Checkpoints: save, save for sampler, save external, load, and their REST reads and writes.

DELETE of a checkpoint has no body either way: any 2xx will do.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field, model_validator

from tx.api.wire.schemas.base import Cursor, StrMetadata, UserMetadata, WireRequest, WireResponse
from tx.api.wire.schemas.models import OptimizerConfig


class SaveWeightsRequest(WireRequest):
    model_id: str
    path: str | None = Field(None, description="the checkpoint name")
    seq_id: int | None = None
    ttl_seconds: int | None = None
    overwrite: bool = False
    user_metadata: StrMetadata = None
    type: Literal["save_weights"] = "save_weights"


class SaveWeightsResponse(WireResponse):
    path: Annotated[str, Field(description="tinker://<run>/weights/<name>")]
    type: Literal["save_weights"] = "save_weights"


class SaveWeightsForSamplerRequest(WireRequest):
    """Named form: `path` (+ ttl/metadata). Ephemeral form: `sampling_session_seq_id`, no path."""

    model_id: str
    path: str | None = None
    sampling_session_seq_id: int | None = None
    kind: Literal["snapshot", "inflight"] = "snapshot"
    seq_id: int | None = None
    ttl_seconds: int | None = None
    user_metadata: StrMetadata = None
    type: Literal["save_weights_for_sampler"] = "save_weights_for_sampler"

    @model_validator(mode="after")
    def _named_or_ephemeral(self) -> SaveWeightsForSamplerRequest:
        if (self.path is None) == (self.sampling_session_seq_id is None):
            raise ValueError("send exactly one of path (named) and sampling_session_seq_id (ephemeral)")
        return self

    @property
    def is_ephemeral(self) -> bool:
        return self.path is None


class SaveWeightsForSamplerResponse(WireResponse):
    """Named saves set `path` (tinker://<run>/sampler_weights/<name>); ephemeral saves set
    `sampling_session_id`."""

    path: str | None = None
    sampling_session_id: str | None = None
    type: Literal["save_weights_for_sampler"] = "save_weights_for_sampler"


class SaveWeightsExternalRequest(WireRequest):
    model_id: str
    path: str
    seq_id: int | None = None
    ttl_seconds: int | None = None
    age_encryption_recipients: list[str] | None = None
    type: Literal["save_weights_external"] = "save_weights_external"


class SaveWeightsExternalResponse(WireResponse):
    path: Annotated[str, Field(description="tinker://<run>/external_weights/<name>")]
    size_bytes: int | None = None
    type: Literal["save_weights_external"] = "save_weights_external"


class LoadWeightsRequest(WireRequest):
    """Create-via-load (`session_id` + `model_seq_id`, the new model's seq 0) or legacy
    `load_state` onto an existing model (`model_id` + `seq_id`)."""

    model_id: str | None = None
    seq_id: int | None = None
    session_id: str | None = None
    model_seq_id: int | None = None
    base_model: str | None = None
    user_metadata: UserMetadata = None
    path: str
    optimizer: bool = False
    optimizer_config: OptimizerConfig | None = None
    weights_access_token: str | None = None
    type: Literal["load_weights"] = "load_weights"

    @model_validator(mode="after")
    def _one_addressing(self) -> LoadWeightsRequest:
        create = self.session_id is not None and self.model_seq_id is not None
        if create == (self.model_id is not None):
            raise ValueError("send either session_id + model_seq_id (create-via-load) or model_id")
        return self

    @property
    def is_create_via_load(self) -> bool:
        return self.model_id is None


class LoadWeightsResponse(WireResponse):
    path: str | None = None
    model_id: str | None = None
    type: Literal["load_weights"] = "load_weights"


CheckpointType = Literal["training", "sampler", "external"]


class Checkpoint(WireResponse):
    checkpoint_id: str = Field(description="the tinker path's tail, e.g. 'weights/step-1'")
    checkpoint_type: CheckpointType
    time: datetime
    tinker_path: str
    size_bytes: int | None = None
    public: bool = False
    user_metadata: dict[str, str] | None = None
    expires_at: datetime | None = None


class CheckpointsListResponse(WireResponse):
    checkpoints: list[Checkpoint]
    cursor: Cursor | None = None


class CheckpointTtlRequest(WireRequest):
    """PUT .../checkpoints/{id}/ttl: seconds from now (1 hour to 10 years), or null for never."""

    ttl_seconds: int | None = None


class ExternalWeightsUrlsResponse(WireResponse):
    urls: dict[str, str] = Field(description="signed URL per file, by its path in the checkpoint")
    expires: datetime


class MergeCheckpointRequest(WireRequest):
    """POST /api/v1/tx/checkpoints/merge (tx's own): a checkpoint of the caller's merged into its base model."""

    source_path: str = Field(max_length=1024, description="tinker://<run>/<kind>/<name> of the caller's")
    name: str = Field(max_length=200, description="the merged model's checkpoint name (external_weights/<name>)")
    ttl_seconds: int | None = Field(None, description="when it expires, in seconds from now (none: never)")
