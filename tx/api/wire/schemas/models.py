"""Models and optimizers: create_model, get_info, optim_step."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from tx.api.wire.schemas.base import UserMetadata, WireRequest, WireResponse


class LoraConfig(WireRequest):
    rank: int = 32
    seed: int | None = None
    train_unembed: bool = True
    train_mlp: bool = True
    train_attn: bool = True


class OptimizerConfig(WireRequest):
    """`{"type":"adamw"}` or `{"type":"dimuon","version":1}`; fixed for a model's life."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    type: str = "adamw"
    version: int | None = None

    @model_serializer(mode="wrap")
    def _drop_unset_version(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The SDK validates {"type":"adamw"} as its extra="forbid" AdamOptimizerConfig.
        data = handler(self)
        if data.get("version") is None:
            data.pop("version", None)
        return data


class AdamParams(WireRequest):
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


class OptimizerParams(WireRequest):
    """Non-Adam step parameters: the SDK's DimuonParams (type "dimuon")."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())

    type: str
    learning_rate: float | None = None
    grad_clip_norm: float = 0.0
    beta1: float = 0.9


class CreateModelRequest(WireRequest):
    session_id: str
    model_seq_id: int
    base_model: str
    user_metadata: UserMetadata = None
    lora_config: LoraConfig | None = None
    optimizer_config: OptimizerConfig = Field(default_factory=OptimizerConfig)
    type: Literal["create_model"] = "create_model"


class CreateModelResponse(WireResponse):
    model_id: str
    type: Literal["create_model"] = "create_model"


class GetInfoRequest(WireRequest):
    model_id: str
    type: Literal["get_info"] = "get_info"


class ModelData(WireResponse):
    arch: str | None = None
    model_name: str | None = Field(None, description="must be set: the SDK asserts on it")
    tokenizer_id: str | None = None


class GetInfoResponse(WireResponse):
    model_id: str
    model_data: ModelData
    optimizer_config: OptimizerConfig = Field(default_factory=OptimizerConfig)
    is_lora: bool | None = None
    lora_rank: int | None = None
    model_name: str | None = None
    type: Literal["get_info"] = "get_info"


class OptimStepRequest(WireRequest):
    """Adam sends `adam_params`; another optimizer sends `optimizer_params` instead."""

    model_id: str
    seq_id: int | None = None
    adam_params: AdamParams | None = None
    optimizer_params: OptimizerParams | None = None
    type: Literal["optim_step"] = "optim_step"

    @model_validator(mode="after")
    def _one_parameter_set(self) -> OptimStepRequest:
        if (self.adam_params is None) == (self.optimizer_params is None):
            raise ValueError("send exactly one of adam_params and optimizer_params")
        return self


class OptimStepResponse(WireResponse):
    metrics: dict[str, float] | None = None
