"""Our protobuf results, decoded by the tinker SDK's own response_conv."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

from tx.api.wire import tinker_public_pb2 as pb
from tx.api.wire.codec import encode_forward_backward_output, encode_sample_response
from tx.types import ForwardBackwardResult, SampledSequence, SampleResult, StopReason


def roundtrip(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float] | None = None, **kw):
    result = ForwardBackwardResult(loss_fn_outputs=outputs, metrics=metrics or {}, **kw)
    return deserialize_forward_backward_output(encode_forward_backward_output(result))


def test_ragged_one_dimensional_logprobs_and_metrics():
    outputs = [
        {"logprobs": np.array([-0.5, -1.25, -3.0], np.float32)},
        {"logprobs": np.array([-0.1] * 5, np.float32)},
        {"logprobs": np.array([], np.float32)},
    ]
    out = roundtrip(outputs, {"loss:sum": 4.75, "num_tokens:sum": 8.0})
    assert out.metrics == {"loss:sum": 4.75, "num_tokens:sum": 8.0}
    assert out.loss_fn_output_type == "TensorData"
    assert len(out.loss_fn_outputs) == 3
    for sent, got in zip(outputs, out.loss_fn_outputs, strict=True):
        td = got["logprobs"]
        assert td.dtype == "float32" and td.shape == [len(sent["logprobs"])]
        np.testing.assert_array_equal(td.to_numpy(), sent["logprobs"])


def test_one_record_when_trailing_shapes_agree():
    outputs = [
        {"logprobs": np.full((3, 2), -1.0, np.float32), "ids": np.arange(3, dtype=np.int64)},
        {"logprobs": np.full((4, 2), -2.0, np.float32), "ids": np.arange(4, dtype=np.int64)},
    ]
    result = ForwardBackwardResult(loss_fn_outputs=outputs, metrics={})
    msg = pb.ForwardBackwardOutput.FromString(encode_forward_backward_output(result))
    assert len(msg.loss_fn_outputs) == 1 and msg.loss_fn_outputs[0].num_datums == 2
    assert list(msg.loss_fn_outputs[0].fields["logprobs"].trailing_shape) == [2]
    offsets = np.frombuffer(msg.loss_fn_outputs[0].fields["logprobs"].offsets, "<i8")
    assert offsets.tolist() == [0, 24, 56]
    out = deserialize_forward_backward_output(msg.SerializeToString())
    assert [d["logprobs"].shape for d in out.loss_fn_outputs] == [[3, 2], [4, 2]]
    assert [d["ids"].dtype for d in out.loss_fn_outputs] == ["int64", "int64"]
    np.testing.assert_array_equal(out.loss_fn_outputs[1]["logprobs"].to_numpy(), outputs[1]["logprobs"])
    np.testing.assert_array_equal(out.loss_fn_outputs[1]["ids"].to_numpy(), [0, 1, 2, 3])


def test_ragged_trailing_shapes_split_into_several_records():
    outputs = [
        {"logprobs": np.arange(6, dtype=np.float32).reshape(3, 2)},
        {"logprobs": np.arange(20, dtype=np.float32).reshape(4, 5)},
        {"logprobs": np.arange(10, dtype=np.float32).reshape(2, 5)},
        {"logprobs": np.arange(3, dtype=np.float32)},
    ]
    result = ForwardBackwardResult(loss_fn_outputs=outputs, metrics={"loss:mean": 1.0})
    msg = pb.ForwardBackwardOutput.FromString(encode_forward_backward_output(result))
    assert [r.num_datums for r in msg.loss_fn_outputs] == [1, 2, 1]
    out = deserialize_forward_backward_output(msg.SerializeToString())
    for sent, got in zip(outputs, out.loss_fn_outputs, strict=True):
        assert got["logprobs"].shape == list(sent["logprobs"].shape)
        np.testing.assert_array_equal(got["logprobs"].to_numpy(), sent["logprobs"])


def test_wider_dtypes_are_narrowed_to_the_public_ones():
    out = roundtrip(
        [{"x": np.array([1.5, 2.5]), "n": np.array([1, 2], np.int32), "b": np.array([True, False])}]
    )
    d = out.loss_fn_outputs[0]
    assert (d["x"].dtype, d["n"].dtype, d["b"].dtype) == ("float32", "int64", "int64")
    assert d["b"].tolist() == [1, 0]


def test_no_datums_and_datums_without_outputs():
    out = roundtrip([], {"loss:sum": 0.0})
    assert out.loss_fn_outputs == [] and out.metrics == {"loss:sum": 0.0}
    out = roundtrip([{}, {}])
    assert out.loss_fn_outputs == [{}, {}]


def test_invalid_results_are_server_bugs():
    with pytest.raises(ValueError, match="name:reduction"):
        encode_forward_backward_output(ForwardBackwardResult(loss_fn_outputs=[], metrics={"loss": 1.0}))
    with pytest.raises(ValueError, match="name:reduction"):
        encode_forward_backward_output(ForwardBackwardResult(loss_fn_outputs=[], metrics={"a:b:c": 1.0}))
    mixed = [{"logprobs": np.zeros(2, np.float32)}, {"other": np.zeros(2, np.float32)}]
    with pytest.raises(ValueError, match="datum 1"):
        encode_forward_backward_output(ForwardBackwardResult(loss_fn_outputs=mixed, metrics={}))
    with pytest.raises(ValueError, match="dtype"):
        encode_forward_backward_output(
            ForwardBackwardResult(loss_fn_outputs=[{"s": np.array(["a"])}], metrics={})
        )


# ---------------------------------------------------------------------------------------------
# SampleResponse


def test_sample_response_sequences_and_nan_prompt_logprobs():
    result = SampleResult(
        sequences=[
            SampledSequence(
                tokens=[5, 6, 2**31 - 1], logprobs=[-0.5, -1.0, -2.0], stop_reason=StopReason.STOP
            ),
            SampledSequence(tokens=[7], logprobs=[-0.25], stop_reason=StopReason.LENGTH),
            SampledSequence(tokens=[], logprobs=[], stop_reason=StopReason.LENGTH),
        ],
        prompt_logprobs=np.array([np.nan, -1.5, -2.5], np.float32),
    )
    out = deserialize_sample_response(encode_sample_response(result))
    assert [s.stop_reason for s in out.sequences] == ["stop", "length", "length"]
    assert out.sequences[0].tokens == [5, 6, 2**31 - 1]
    assert out.sequences[0].logprobs == [-0.5, -1.0, -2.0]
    assert out.sequences[1].tokens == [7] and out.sequences[1].logprobs == [-0.25]
    assert out.sequences[2].tokens == [] and out.sequences[2].logprobs is None
    assert out.prompt_logprobs == [None, -1.5, -2.5]
    assert out.topk_prompt_logprobs is None
    assert out.prompt_cache_hit_tokens == 0


def test_sample_response_without_logprobs_or_prompt_logprobs():
    result = SampleResult(
        sequences=[SampledSequence(tokens=[1, 2], logprobs=[], stop_reason=StopReason.STOP)]
    )
    out = deserialize_sample_response(encode_sample_response(result))
    assert out.sequences[0].logprobs is None and out.prompt_logprobs is None


def test_topk_prompt_logprobs_with_empty_cells():
    token_ids = np.array([[0, 0], [11, 12], [13, -1]], np.int64)
    logprobs = np.array([[np.nan, np.nan], [-0.1, -0.2], [-0.3, np.nan]], np.float32)
    result = SampleResult(
        sequences=[SampledSequence(tokens=[1], logprobs=[-1.0], stop_reason="stop")],
        prompt_logprobs=np.array([np.nan, -0.1, -0.3], np.float32),
        topk_prompt_logprobs=(token_ids, logprobs),
    )
    body = encode_sample_response(result)
    msg = pb.SampleResponse.FromString(body)
    assert (msg.topk_prompt_logprobs.length, msg.topk_prompt_logprobs.k) == (3, 2)
    assert np.frombuffer(msg.topk_prompt_logprobs.logprobs, "<f4")[0] == np.float32(-99999.0)
    out = deserialize_sample_response(body)
    top = out.topk_prompt_logprobs
    assert top[0] is None
    assert [(t, round(lp, 4)) for t, lp in top[1]] == [(11, -0.1), (12, -0.2)]
    assert [(t, round(lp, 4)) for t, lp in top[2]] == [(13, -0.3)]
    assert math.isclose(out.prompt_logprobs[2], -0.3, rel_tol=1e-6)


def test_mismatched_logprobs_are_server_bugs():
    bad = SampleResult(
        sequences=[SampledSequence(tokens=[1, 2], logprobs=[-1.0], stop_reason=StopReason.STOP)]
    )
    with pytest.raises(ValueError, match="logprobs"):
        encode_sample_response(bad)
    bad_topk = SampleResult(sequences=[], topk_prompt_logprobs=(np.zeros((2, 2)), np.zeros((2, 3))))
    with pytest.raises(ValueError, match="top-k"):
        encode_sample_response(bad_topk)
