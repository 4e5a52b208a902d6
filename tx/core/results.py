"""What the core's operations resolve their futures with (besides the trainer's own results).

The API layer turns each of these into the JSON result the SDK expects; forward/backward and
sample results (`tx.types.ForwardBackwardResult`, `tx.types.SampleResult`) go out as protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelCreated:
    model_id: str


@dataclass(frozen=True)
class CheckpointSaved:
    path: str


@dataclass(frozen=True)
class ExternalSaved:
    path: str
    size_bytes: int


@dataclass(frozen=True)
class SamplerSaved:
    path: str | None
    sampling_session_id: str | None


@dataclass(frozen=True)
class WeightsLoaded:
    path: str
    model_id: str


@dataclass(frozen=True)
class CustomLossCreated:
    loss_id: str
