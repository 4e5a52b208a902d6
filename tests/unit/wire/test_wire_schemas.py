"""JSON schemas against the SDK: its request bodies parse with ours, our responses parse with its."""

from __future__ import annotations

from datetime import UTC, datetime

import pydantic
import pytest
from tinker import types as sdk
from tinker._compat import model_dump
from tinker.types.save_weights_external_response import SaveWeightsExternalResponseInternal
from tinker.types.try_again_response import TryAgainResponse as SdkTryAgainResponse

from tx.api.wire.schemas.base import Cursor
from tx.api.wire.schemas.checkpoints import (
    Checkpoint,
    CheckpointsListResponse,
    LoadWeightsRequest,
    LoadWeightsResponse,
    SaveWeightsExternalRequest,
    SaveWeightsExternalResponse,
    SaveWeightsForSamplerRequest,
    SaveWeightsForSamplerResponse,
    SaveWeightsRequest,
    SaveWeightsResponse,
)
from tx.api.wire.schemas.client import (
    ClientConfigRequest,
    ClientConfigResponse,
    ClientDynamicConfigResponse,
    GetServerCapabilitiesResponse,
    HEALTH_EXTRAS,
    HealthResponse,
    ModelLoading,
    SupportedModel,
    TelemetryResponse,
    TelemetrySendRequest,
)
from tx.api.wire.schemas.futures import (
    RequestFailedResponse,
    RetrieveFutureRequest,
    TryAgainResponse,
    UntypedAPIFuture,
)
from tx.api.wire.schemas.identity import AuthTokenResponse
from tx.api.wire.schemas.models import (
    CreateModelRequest,
    CreateModelResponse,
    GetInfoRequest,
    GetInfoResponse,
    ModelData,
    OptimStepRequest,
    OptimStepResponse,
)
from tx.api.wire.schemas.runs import TX_EXTRAS, TrainingRun, TrainingRunsResponse, WeightsInfoResponse
from tx.api.wire.schemas.sampling import (
    CreateSamplingSessionRequest,
    CreateSamplingSessionResponse,
    GetSamplerResponse,
)
from tx.api.wire.schemas.sessions import (
    CreateSessionRequest,
    CreateSessionResponse,
    SessionFinishRequest,
    SessionHeartbeatRequest,
    SessionHeartbeatResponse,
)
from tx.types import ErrorCategory


def body(request: pydantic.BaseModel) -> dict:
    """Exactly what the SDK's resources put on the wire."""
    return model_dump(request, exclude_unset=False, exclude_none=True, mode="json")


def test_client_config_and_session_requests():
    assert (
        ClientConfigRequest.model_validate(
            body(sdk.ClientConfigRequest(sdk_version="0.38.0"))
        ).sdk_version
        == "0.38.0"
    )
    sess = sdk.CreateSessionRequest(tags=[], user_metadata={}, sdk_version="0.38.0")
    parsed = CreateSessionRequest.model_validate(body(sess))
    assert (parsed.tags, parsed.user_metadata, parsed.project_id) == ([], {}, None)
    sess = sdk.CreateSessionRequest(
        tags=["a"], user_metadata=None, sdk_version="x", project_id="p", display_name="d"
    )
    parsed = CreateSessionRequest.model_validate(body(sess))
    assert (parsed.tags, parsed.project_id, parsed.display_name) == (["a"], "p", "d")
    hb = SessionHeartbeatRequest.model_validate(body(sdk.SessionHeartbeatRequest(session_id="s1")))
    assert hb.session_id == "s1"
    finish = SessionFinishRequest.model_validate({"reason": {"type": "interrupted"}, "detail": None})
    assert finish.reason.type == "interrupted"
    with pytest.raises(pydantic.ValidationError):
        SessionFinishRequest.model_validate({"reason": {"type": "bogus"}})


def test_unknown_keys_are_ignored():
    parsed = GetInfoRequest.model_validate({"model_id": "m", "type": "get_info", "future_field": 1})
    assert parsed.model_id == "m"


def test_telemetry_request():
    now = datetime.now(UTC)
    events = [
        sdk.SessionStartEvent(
            event="SESSION_START", event_id="e1", event_session_index=0, severity="INFO", timestamp=now
        ),
        sdk.UnhandledExceptionEvent(
            event="UNHANDLED_EXCEPTION",
            event_id="e2",
            event_session_index=1,
            severity="ERROR",
            timestamp=now,
            error_message="boom",
            error_type="ValueError",
        ),
    ]
    req = sdk.TelemetrySendRequest(
        events=events, platform="linux", sdk_version="0.38.0", session_id="s", process_uuid="u"
    )
    parsed = TelemetrySendRequest.model_validate(body(req))
    assert [e.event for e in parsed.events] == ["SESSION_START", "UNHANDLED_EXCEPTION"]
    assert parsed.events[1].model_extra["error_message"] == "boom"


def test_create_model_request_with_adam_and_dimuon():
    req = sdk.CreateModelRequest(
        session_id="s",
        model_seq_id=0,
        base_model="Qwen/Qwen3-0.6B",
        lora_config=sdk.LoraConfig(rank=8, train_unembed=False),
    )
    parsed = CreateModelRequest.model_validate(body(req))
    assert parsed.lora_config.rank == 8 and parsed.lora_config.train_unembed is False
    assert parsed.optimizer_config.type == "adamw" and parsed.user_metadata is None
    req = sdk.CreateModelRequest(
        session_id="s",
        model_seq_id=2,
        base_model="b",
        user_metadata={"k": [1]},
        lora_config=sdk.LoraConfig(rank=4, seed=3),
        optimizer_config=sdk.DimuonOptimizerConfig(),
    )
    parsed = CreateModelRequest.model_validate(body(req))
    assert parsed.optimizer_config.type == "dimuon" and parsed.optimizer_config.version == 1
    assert parsed.lora_config.seed == 3 and parsed.user_metadata == {"k": [1]}


def test_optim_step_request_forms():
    adam = sdk.OptimStepRequest(
        adam_params=sdk.AdamParams(learning_rate=3e-4, weight_decay=0.1), model_id="m", seq_id=4
    )
    parsed = OptimStepRequest.model_validate(body(adam))
    assert parsed.adam_params.learning_rate == 3e-4 and parsed.adam_params.weight_decay == 0.1
    assert parsed.optimizer_params is None and parsed.seq_id == 4
    dimuon = sdk.OptimStepRequest(
        optimizer_params=sdk.DimuonParams(learning_rate=0.02), model_id="m", seq_id=5
    )
    parsed = OptimStepRequest.model_validate(body(dimuon))
    assert parsed.adam_params is None and parsed.optimizer_params.type == "dimuon"
    with pytest.raises(pydantic.ValidationError):
        OptimStepRequest.model_validate({"model_id": "m", "seq_id": 1})


def test_save_and_load_requests():
    parsed = SaveWeightsRequest.model_validate(
        body(sdk.SaveWeightsRequest(model_id="m", path="ck1", seq_id=3))
    )
    assert (parsed.path, parsed.overwrite, parsed.ttl_seconds) == ("ck1", False, None)
    named = sdk.SaveWeightsForSamplerRequest(
        model_id="m", path="s1", seq_id=4, ttl_seconds=7200, user_metadata={"a": "b"}
    )
    parsed = SaveWeightsForSamplerRequest.model_validate(body(named))
    assert not parsed.is_ephemeral and parsed.ttl_seconds == 7200 and parsed.kind == "snapshot"
    eph = sdk.SaveWeightsForSamplerRequest(model_id="m", seq_id=5, sampling_session_seq_id=2, kind="inflight")
    parsed = SaveWeightsForSamplerRequest.model_validate(body(eph))
    assert parsed.is_ephemeral and parsed.sampling_session_seq_id == 2 and parsed.kind == "inflight"
    ext = sdk.SaveWeightsExternalRequest(
        model_id="m", path="hf", seq_id=6, age_encryption_recipients=["age1x"]
    )
    assert SaveWeightsExternalRequest.model_validate(body(ext)).age_encryption_recipients == ["age1x"]

    create = sdk.LoadWeightsRequest(
        session_id="s", model_seq_id=1, path="tinker://r/weights/c", optimizer=True
    )
    parsed = LoadWeightsRequest.model_validate(body(create))
    assert parsed.is_create_via_load and parsed.optimizer and parsed.model_id is None
    legacy = sdk.LoadWeightsRequest(
        model_id="s:train:0", seq_id=1, path="tinker://r/weights/c", optimizer=False
    )
    parsed = LoadWeightsRequest.model_validate(body(legacy))
    assert not parsed.is_create_via_load and parsed.seq_id == 1
    with pytest.raises(pydantic.ValidationError):
        LoadWeightsRequest.model_validate({"path": "tinker://r/weights/c", "optimizer": False})


def test_sampling_session_and_future_requests():
    req = sdk.CreateSamplingSessionRequest(
        session_id="s", sampling_session_seq_id=0, model_path="tinker://r/sampler_weights/x"
    )
    parsed = CreateSamplingSessionRequest.model_validate(body(req))
    assert parsed.model_path == "tinker://r/sampler_weights/x" and parsed.base_model is None
    fut = RetrieveFutureRequest.model_validate(
        body(sdk.FutureRetrieveRequest(request_id="r1", allow_metadata_only=True))
    )
    assert fut.allow_metadata_only is True


# ---------------------------------------------------------------------------------------------
# Responses: the SDK must accept ours, and we send exactly the fields it reads.

_NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
_CKPT = Checkpoint(
    checkpoint_id="weights/c1", checkpoint_type="training", time=_NOW, tinker_path="tinker://r/weights/c1"
)

RESPONSE_PAIRS = [
    (ClientConfigResponse(proto_compress_fwdbwd=True), sdk.ClientConfigResponse),
    (ClientDynamicConfigResponse(), sdk.ClientDynamicConfigResponse),
    (AuthTokenResponse(jwt="eyJ"), sdk.AuthTokenResponse),
    (CreateSessionResponse(session_id="s", warning_message="w"), sdk.CreateSessionResponse),
    (SessionHeartbeatResponse(), sdk.SessionHeartbeatResponse),
    (TelemetryResponse(), sdk.TelemetryResponse),
    (
        GetInfoResponse(
            model_id="s:train:0",
            model_data=ModelData(arch="qwen3", model_name="Q", tokenizer_id="Q"),
            is_lora=True,
            lora_rank=8,
            model_name="Q",
        ),
        sdk.GetInfoResponse,
    ),
    (CreateModelResponse(model_id="s:train:0"), sdk.CreateModelResponse),
    (OptimStepResponse(metrics={"grad_norm:mean": 1.5}), sdk.OptimStepResponse),
    (SaveWeightsResponse(path="tinker://r/weights/c"), sdk.SaveWeightsResponse),
    (
        SaveWeightsForSamplerResponse(path="tinker://r/sampler_weights/c"),
        sdk.SaveWeightsForSamplerResponseInternal,
    ),
    (
        SaveWeightsForSamplerResponse(sampling_session_id="s:sample:3"),
        sdk.SaveWeightsForSamplerResponseInternal,
    ),
    (
        SaveWeightsExternalResponse(path="tinker://r/external_weights/hf", size_bytes=10),
        SaveWeightsExternalResponseInternal,
    ),
    (LoadWeightsResponse(path="tinker://r/weights/c", model_id="s:train:1"), sdk.LoadWeightsResponse),
    (CreateSamplingSessionResponse(sampling_session_id="s:sample:0"), sdk.CreateSamplingSessionResponse),
    (
        GetSamplerResponse(
            sampler_id="s:sample:0", base_model="b", model_path="tinker://r/sampler_weights/c"
        ),
        sdk.GetSamplerResponse,
    ),
    (UntypedAPIFuture(request_id="r1", sample_sequence_ids=["a", "b"]), sdk.UntypedAPIFuture),
    (TryAgainResponse(request_id="r1", queue_state="paused_capacity"), SdkTryAgainResponse),
    (RequestFailedResponse(error="bad input", category=ErrorCategory.USER), sdk.RequestFailedResponse),
    (
        WeightsInfoResponse(base_model="b", is_lora=True, lora_rank=8, train_mlp=True),
        sdk.WeightsInfoResponse,
    ),
    (_CKPT, sdk.Checkpoint),
    (
        CheckpointsListResponse(
            checkpoints=[_CKPT], cursor=Cursor(offset=0, limit=20, total_count=1)
        ),
        sdk.CheckpointsListResponse,
    ),
    (
        TrainingRun(
            training_run_id="s:train:0",
            base_model="b",
            model_owner="me",
            is_lora=True,
            last_request_time=_NOW,
            lora_rank=8,
            last_checkpoint=_CKPT,
        ),
        sdk.TrainingRun,
    ),
    (
        TrainingRunsResponse(training_runs=[], cursor=Cursor(offset=0, limit=20, total_count=0)),
        sdk.TrainingRunsResponse,
    ),
    (
        GetServerCapabilitiesResponse(
            supported_models=[SupportedModel(model_name="b", max_context_length=4096)]
        ),
        sdk.GetServerCapabilitiesResponse,
    ),
    (HealthResponse(), sdk.HealthResponse),
]


@pytest.mark.parametrize(("response", "sdk_type"), RESPONSE_PAIRS, ids=lambda x: type(x).__name__)
@pytest.mark.parametrize("exclude_none", [False, True])
def test_sdk_accepts_our_responses(response: pydantic.BaseModel, sdk_type: type, exclude_none: bool):
    wire = response.model_dump(mode="json", exclude_none=exclude_none)
    parsed = sdk_type.model_validate(wire)
    expected = response.model_dump(mode="json", exclude_none=True)
    expected.pop("queue_state_reason", None)  # read from the raw dict, see below
    for name in TX_EXTRAS | HEALTH_EXTRAS:  # tx's own fields, which the SDK's types ignore (extra="ignore")
        expected.pop(name, None)
    assert parsed.model_dump(mode="json", exclude_none=True) == expected


@pytest.mark.parametrize(("response", "sdk_type"), RESPONSE_PAIRS, ids=lambda x: type(x).__name__)
def test_responses_have_the_sdks_fields(response: pydantic.BaseModel, sdk_type: type):
    # The SDK reads queue_state_reason straight from the try_again dict, not through its model.
    read_from_raw_dict = {"queue_state_reason"}
    tx_only = read_from_raw_dict | TX_EXTRAS | HEALTH_EXTRAS
    assert set(type(response).model_fields) - tx_only == set(sdk_type.model_fields)


def test_the_sdk_ignores_the_run_fields_tx_adds():
    wire = TrainingRun(training_run_id="s:train:0", base_model="b", model_owner="me", is_lora=True,
                       last_request_time=_NOW, name="n", tags=["a"], base_revision="c" * 40,
                       base_fingerprint="sha256:0").model_dump(mode="json")
    assert sdk.TrainingRun.model_config.get("extra") == "ignore"
    assert sdk.TrainingRun.model_validate(wire).training_run_id == "s:train:0"


def test_the_sdk_ignores_the_health_fields_tx_adds():
    loading = [ModelLoading(model="Qwen/Qwen3-8B", fraction=0.4, seconds=3.0)]
    wire = HealthResponse(loading=loading).model_dump(mode="json")
    assert sdk.HealthResponse.model_config.get("extra") == "ignore"
    assert sdk.HealthResponse.model_validate(wire).status == "ok"


def test_client_config_flags_tx_sends():
    wire = ClientConfigResponse(proto_compress_fwdbwd=True).model_dump(mode="json")
    cfg = sdk.ClientConfigResponse.model_validate(wire)
    assert cfg.use_pyqwest_transport is False and cfg.proto_compress_fwdbwd is True
    assert cfg.parallel_fwdbwd_chunks is True and cfg.pjwt_auth_enabled is False


def test_adamw_optimizer_config_reads_back_as_the_sdks_adam_config():
    wire = GetInfoResponse(model_id="m", model_data=ModelData(model_name="b")).model_dump(
        mode="json"
    )
    assert wire["optimizer_config"] == {"type": "adamw"}
    assert isinstance(sdk.GetInfoResponse.model_validate(wire).optimizer_config, sdk.AdamOptimizerConfig)
    wire = WeightsInfoResponse(base_model="b", is_lora=False).model_dump(mode="json")
    assert isinstance(sdk.WeightsInfoResponse.model_validate(wire).optimizer_config, sdk.AdamOptimizerConfig)


def test_request_failed_category_is_lowercase():
    wire = RequestFailedResponse(error="x", category=ErrorCategory.SERVER).model_dump(mode="json")
    assert wire == {"error": "x", "category": "server"}
    assert sdk.RequestFailedResponse.model_validate(wire).category == sdk.RequestErrorCategory.Server
