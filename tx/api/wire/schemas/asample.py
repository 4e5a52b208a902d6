"""The asample JSON body and the JSON forms of ModelInput and TensorData.

See docs/wire-contract.md#the-sample-request and docs/wire-contract.md#model-inputs.

Mirrors tinker 0.38.0's `SampleRequest`, `SamplingParams`, `ModelInput` chunks and `TensorData`.
Images arrive base64-encoded; `tx/api/wire/convert.py` decodes them and builds domain types.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from tx.api.wire.schemas.base import WireRequest


class EncodedTextChunkJson(WireRequest):
    tokens: list[int]
    type: Literal["encoded_text"] = "encoded_text"


class ImageChunkJson(WireRequest):
    data: str = Field(description="base64 (standard alphabet) of the encoded image")
    format: Literal["png", "jpeg"]
    expected_tokens: int | None = None
    type: Literal["image"] = "image"


class ImageAssetPointerChunkJson(WireRequest):
    location: str
    format: Literal["png", "jpeg"]
    expected_tokens: int | None = None
    type: Literal["image_asset_pointer"] = "image_asset_pointer"


class DmelChunkJson(WireRequest):
    dmel: str = Field(description="base64 of a serialized TensorContainer (audio)")
    type: Literal["dmel"] = "dmel"


ModelInputChunkJson = Annotated[
    EncodedTextChunkJson | ImageChunkJson | ImageAssetPointerChunkJson | DmelChunkJson,
    Field(discriminator="type"),
]


class ModelInputJson(WireRequest):
    chunks: list[ModelInputChunkJson]


class TensorDataJson(WireRequest):
    """Flat values (or CSR values) plus an optional shape; only int64/float32 are public."""

    data: list[int] | list[float]
    dtype: Literal["int64", "float32"]
    shape: list[int] | None = None
    sparse_crow_indices: list[int] | None = None
    sparse_col_indices: list[int] | None = None


class SamplingParamsJson(WireRequest):
    """`stop`: omitted = stop at EOS; [] = never stop early, even at EOS; strings or token ids."""

    max_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0


class SampleRequestJson(WireRequest):
    """POST /api/v1/asample. The SDK always addresses a sampling session with a seq_id."""

    num_samples: int = 1
    prompt: ModelInputJson
    sampling_params: SamplingParamsJson
    base_model: str | None = None
    model_path: str | None = None
    sampling_session_id: str | None = None
    seq_id: int | None = None
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    target_prompt_logprobs: TensorDataJson | None = None
    prompt_alt_tokens_k: int = 0
    prompt_logprobs_last_n: int | None = None
    record_stability_info: bool | None = None
    type: Literal["sample"] = "sample"
