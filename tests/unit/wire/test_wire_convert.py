"""JSON -> domain converters, fed with bodies the tinker SDK builds."""

from __future__ import annotations

import numpy as np
import pytest
from tinker import types as sdk
from tinker._compat import model_dump
from tinker.types._pydantic_types.tensor_data import TensorData as SdkTensorDataModel

from tx.api.wire import convert
from tx.api.wire.schemas import models
from tx.api.wire.schemas.asample import ModelInputJson, SampleRequestJson, TensorDataJson
from tx.optimizers import ADAMW, DIMUON, AdamParams, DimuonParams
from tx.types import ImageAssetPointer, ImageChunk, LoraConfig, TextChunk, UserError

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(30))


def sample_body(**overrides) -> dict:
    fields = dict(
        prompt=sdk.ModelInput.from_ints([1, 2, 3, 4]),
        sampling_params=sdk.SamplingParams(max_tokens=4, temperature=0.7),
        sampling_session_id="s:sample:0",
        seq_id=3,
        num_samples=2,
        prompt_logprobs=False,
    )
    fields.update(overrides)
    return model_dump(sdk.SampleRequest(**fields), exclude_unset=False, exclude_none=True, mode="json")


def to_domain(**overrides):
    return convert.sample_request_to_domain(SampleRequestJson.model_validate(sample_body(**overrides)))


def test_basic_sample_request():
    wire = SampleRequestJson.model_validate(sample_body())
    assert (wire.sampling_session_id, wire.seq_id, wire.type) == ("s:sample:0", 3, "sample")
    req = convert.sample_request_to_domain(wire)
    assert req.prompt.chunks == (TextChunk((1, 2, 3, 4)),)
    assert req.num_samples == 2 and req.prompt_logprobs is False and req.topk_prompt_logprobs == 0
    p = req.params
    assert (p.max_tokens, p.temperature, p.top_k, p.top_p, p.seed) == (4, 0.7, -1, 1.0, None)
    assert (p.stop_at_eos, p.stop_token_ids, p.stop_strings) == (True, (), ())


@pytest.mark.parametrize(
    ("stop", "eos", "ids", "strings"),
    [
        (None, True, (), ()),
        ([], False, (), ()),
        ([7, 9], True, (7, 9), ()),
        ("\n", True, (), ("\n",)),
        (["</s>", "\n\n"], True, (), ("</s>", "\n\n")),
    ],
)
def test_stop_mapping(stop, eos, ids, strings):
    params = sdk.SamplingParams(max_tokens=3, stop=stop)
    p = to_domain(sampling_params=params).params
    assert (p.stop_at_eos, p.stop_token_ids, p.stop_strings) == (eos, ids, strings)


def test_seed_and_top_k_and_default_max_tokens():
    p = to_domain(sampling_params=sdk.SamplingParams(seed=2**64 - 1, top_k=0)).params
    assert 0 <= p.seed < 2**63 - 1 and p.top_k == -1
    assert p.max_tokens == convert.SamplingParams().max_tokens
    assert to_domain(sampling_params=sdk.SamplingParams(seed=12)).params.seed == 12


def test_prompt_logprobs_options():
    req = to_domain(prompt_logprobs=True, topk_prompt_logprobs=5, prompt_logprobs_last_n=2)
    assert req.prompt_logprobs and req.topk_prompt_logprobs == 5 and req.prompt_logprobs_last_n == 2
    with pytest.raises(UserError, match="len\\(prompt\\) - 1 = 3"):
        to_domain(prompt_logprobs=True, prompt_logprobs_last_n=4)
    with pytest.raises(UserError, match="needs prompt_logprobs"):
        to_domain(prompt_logprobs=False, prompt_logprobs_last_n=1)


def test_image_and_asset_chunks_from_sdk_json():
    prompt = sdk.ModelInput(
        chunks=[
            sdk.EncodedTextChunk(tokens=[1]),
            sdk.ImageChunk(data=PNG, format="png", expected_tokens=9),
            sdk.ImageAssetPointerChunk(location="s3://bucket/x.jpeg", format="jpeg"),
        ]
    )
    dumped = model_dump(prompt, exclude_none=True, mode="json")
    assert isinstance(dumped["chunks"][1]["data"], str)  # base64 on the wire
    model_input = convert.model_input_from_json(ModelInputJson.model_validate(dumped))
    assert model_input.chunks == (
        TextChunk((1,)),
        ImageChunk(data=PNG, format="png", expected_tokens=9),
        ImageAssetPointer(location="s3://bucket/x.jpeg", format="jpeg", expected_tokens=None),
    )


def test_bad_prompts():
    bad_b64 = {
        "chunks": [
            {"type": "encoded_text", "tokens": [1]},
            {"type": "image", "data": "@@not base64@@", "format": "png"},
        ]
    }
    with pytest.raises(UserError, match="prompt chunk 1: image data is not valid base64"):
        convert.model_input_from_json(ModelInputJson.model_validate(bad_b64))
    dmel = {"chunks": [{"type": "dmel", "dmel": "AAAA"}]}
    with pytest.raises(UserError, match="dmel"):
        convert.model_input_from_json(ModelInputJson.model_validate(dmel))
    with pytest.raises(UserError, match="empty"):
        to_domain(prompt=sdk.ModelInput(chunks=[]))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (dict(num_samples=0), "num_samples"),
        (dict(sampling_params=sdk.SamplingParams(max_tokens=0)), "max_tokens"),
        (dict(sampling_params=sdk.SamplingParams(temperature=-1)), "temperature"),
        (dict(sampling_params=sdk.SamplingParams(top_p=0)), "top_p"),
        (dict(sampling_params=sdk.SamplingParams(top_k=-5)), "top_k"),
        (dict(topk_sample_logprobs=1025), "topk_sample_logprobs"),
        (dict(prompt_alt_tokens_k=-1), "prompt_alt_tokens_k"),
        (dict(target_prompt_logprobs=SdkTensorDataModel(data=[1, 2], dtype="int64", shape=[2, 1])), "3 rows"),
        (dict(target_prompt_logprobs=SdkTensorDataModel(data=[-1, -1, -1], dtype="int64", shape=[3, 1])), "names no"),
        (dict(target_prompt_logprobs=SdkTensorDataModel(data=[1.0, 2.0, 3.0], dtype="float32", shape=[3, 1])),
         "int64"),
        (dict(target_prompt_logprobs=SdkTensorDataModel(data=[1, -2, 3], dtype="int64", shape=[3, 1])), "ids >= -1"),
    ],
)
def test_rejected_sample_requests(overrides, match):
    with pytest.raises(UserError, match=match):
        to_domain(**overrides)


def test_prompt_scores_convert_keeping_a_sparse_layout():
    sparse = SdkTensorDataModel(data=[7, 8], dtype="int64", shape=[3, 2], sparse_crow_indices=[0, 0, 0, 2],
                                sparse_col_indices=[0, 1])
    request = to_domain(topk_sample_logprobs=3, prompt_alt_tokens_k=2, target_prompt_logprobs=sparse)
    assert (request.topk_sample_logprobs, request.prompt_alt_tokens_k) == (3, 2)
    target = request.target_prompt_logprobs
    assert target.ids.tolist() == [[-1, -1], [-1, -1], [7, 8]]
    assert [a.tolist() for a in target.csr] == [[0, 0, 0, 2], [0, 1]]


def test_tensor_data_from_json_dense_and_csr_with_pad():
    td = SdkTensorDataModel(data=[5, 6, 7, 8], dtype="int64", shape=[2, 2])
    arr = convert.tensor_data_from_json(
        TensorDataJson.model_validate(model_dump(td, exclude_none=True, mode="json"))
    )
    assert arr.dtype == np.int64 and arr.tolist() == [[5, 6], [7, 8]]
    sparse = SdkTensorDataModel(
        data=[4, 9], dtype="int64", shape=[3, 2], sparse_crow_indices=[0, 1, 1, 2], sparse_col_indices=[1, 0]
    )
    wire = TensorDataJson.model_validate(model_dump(sparse, exclude_none=True, mode="json"))
    assert convert.tensor_data_from_json(wire, pad_value=-1).tolist() == [[-1, 4], [-1, -1], [9, -1]]
    floats = TensorDataJson(data=[0.5, 1], dtype="float32")
    assert convert.tensor_data_from_json(floats).dtype == np.float32


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        (dict(data=[1, 2, 3], dtype="int64", shape=[2, 2]), "needs 4"),
        (dict(data=[1.5], dtype="int64"), "non-integer"),
        (dict(data=[2**70], dtype="int64"), "int64"),
        (dict(data=[1], dtype="int64", shape=[1, 1], sparse_crow_indices=[0, 1]), "together"),
        (
            dict(data=[1], dtype="int64", shape=[1, 1], sparse_crow_indices=[0, 1], sparse_col_indices=[3]),
            "column",
        ),
    ],
)
def test_bad_tensor_data_json(wire, match):
    with pytest.raises(UserError, match=match):
        convert.tensor_data_from_json(TensorDataJson.model_validate(wire))


def test_lora_and_optimizer_conversion():
    req = models.CreateModelRequest.model_validate(
        model_dump(
            sdk.CreateModelRequest(
                session_id="s",
                model_seq_id=0,
                base_model="b",
                lora_config=sdk.LoraConfig(rank=16, seed=4, train_attn=False),
            ),
            exclude_none=True,
            mode="json",
        )
    )
    assert convert.lora_config_to_domain(req.lora_config) == LoraConfig(rank=16, seed=4, train_attn=False)
    assert convert.lora_config_to_domain(None) == LoraConfig()
    assert convert.optimizer_config_to_domain(req.optimizer_config) == ADAMW
    with pytest.raises(UserError, match="rank"):
        convert.lora_config_to_domain(models.LoraConfig(rank=0))
    with pytest.raises(UserError, match="at least one"):
        convert.lora_config_to_domain(models.LoraConfig(train_attn=False, train_mlp=False, train_unembed=False))
    assert convert.optimizer_config_to_domain(models.OptimizerConfig(type="dimuon", version=1)) == DIMUON
    with pytest.raises(UserError, match="version 2"):
        convert.optimizer_config_to_domain(models.OptimizerConfig(type="dimuon", version=2))
    with pytest.raises(UserError, match="'sgd' is not supported"):
        convert.optimizer_config_to_domain(models.OptimizerConfig(type="sgd"))


def test_optim_step_conversion():
    adam = sdk.OptimStepRequest(
        adam_params=sdk.AdamParams(learning_rate=2e-4, grad_clip_norm=1.0), model_id="m", seq_id=2
    )
    req = models.OptimStepRequest.model_validate(model_dump(adam, exclude_none=True, mode="json"))
    assert convert.optim_step_params_to_domain(req) == AdamParams(learning_rate=2e-4, grad_clip_norm=1.0)
    dimuon = sdk.OptimStepRequest(
        optimizer_params=sdk.DimuonParams(learning_rate=0.02), model_id="m", seq_id=3
    )
    req = models.OptimStepRequest.model_validate(model_dump(dimuon, exclude_none=True, mode="json"))
    assert convert.optim_step_params_to_domain(req) == DimuonParams(learning_rate=0.02)
    with pytest.raises(UserError, match="'lion' is not supported"):
        convert.optim_step_params_to_domain(models.OptimStepRequest(model_id="m", optimizer_params={"type": "lion"}))
    with pytest.raises(UserError, match="beta1"):
        convert.adam_params_to_domain(models.AdamParams(beta1=1.0))
