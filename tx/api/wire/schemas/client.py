"""Client bootstrap, server capabilities, health and telemetry."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from tx.api.wire.schemas.base import WireRequest, WireResponse


class ClientConfigRequest(WireRequest):
    sdk_version: str | None = None


class ClientConfigResponse(WireResponse):
    """Flags that steer the SDK (docs/wire-contract.md#bootstrap-and-client-flags). Defaults are tx's choices, not the SDK's."""

    pjwt_auth_enabled: bool = False
    credential_default_source: str = "api_key"
    use_pyqwest_transport: bool = Field(default=False, description="false: clients use plain httpx")
    proto_compress_fwdbwd: bool = Field(default=False, description="clients zstd-compress fwd/bwd bodies")
    parallel_fwdbwd_chunks: bool = True
    fwdbwd_max_chunk_len: int = 1024
    fwdbwd_max_chunk_bytes_count: int = 5_000_000
    fwdbwd_dispatch_bytes_semaphore_size: int = 50_000_000
    sample_dispatch_bytes_semaphore_size: int = 10 * 1024 * 1024
    inflight_response_bytes_semaphore_size: int = 50 * 1024 * 1024
    billing_exception_max_pause_duration_sec: int = 3600
    sample_no_retries: bool = False
    sample_enable_stuck_detection: bool = True
    sample_max_concurrent_requests: int = 2000
    sample_use_retrieve_futures: bool = False
    custom_loss_server_side: bool = False
    sample_join_sampling_session: bool = False


class ClientDynamicConfigResponse(WireResponse):
    refresh_interval_sec: int = 300
    sample_cancel_enabled: bool = False
    sample_cancel_max_batch_size: int = 64


class SupportedModel(WireResponse):
    model_name: str | None = None
    max_context_length: int | None = None
    trainable: bool | None = None
    sampleable: bool | None = None


class GetServerCapabilitiesResponse(WireResponse):
    supported_models: list[SupportedModel]


class ModelLoading(WireResponse):
    model: str = Field(description="its hub id, or its directory's name")
    fraction: float | None = Field(description="the share of its weights loaded (None: still reading its files)")
    seconds: float = Field(description="since the load began")


HEALTH_EXTRAS = frozenset({"loading"})  # what tx's HealthResponse adds to the SDK's (which ignores unknown fields)


class HealthResponse(WireResponse):
    status: Literal["ok"] = "ok"
    loading: list[ModelLoading] = Field(default_factory=list, description="base models the trainer is loading now")


class TelemetryEvent(WireRequest):
    """One telemetry event; kind-specific fields (error_message, event_data, ...) are kept."""

    model_config = ConfigDict(extra="allow")

    event: str
    event_id: str | None = None
    event_session_index: int | None = None
    severity: str | None = None
    timestamp: str | None = None


class TelemetrySendRequest(WireRequest):
    events: list[TelemetryEvent]
    platform: str | None = None
    sdk_version: str | None = None
    session_id: str | None = None
    process_uuid: str | None = None


class TelemetryResponse(WireResponse):
    status: Literal["accepted"] = "accepted"
