"""decode_forward_backward_request against bodies built by the tinker SDK's own encoder."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zstandard
from tinker import types as sdk
from tinker.proto.request_conv import forward_backward_request_to_proto

from tx.api.wire import tinker_public_pb2 as pb
from tx.api.wire.codec import decode_forward_backward_request
from tx.types import ImageChunk, ProvenanceSpan, TextChunk, UserError

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))


def sdk_body(
    data: list[sdk.Datum],
    *,
    loss_fn: str = "cross_entropy",
    loss_fn_config: dict | None = None,
    model_id: str = "sess:train:0",
    seq_id: int = 1,
    forward_only: bool = False,
) -> bytes:
    fb_input = sdk.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=loss_fn_config)
    request = sdk.ForwardBackwardRequest(forward_backward_input=fb_input, model_id=model_id, seq_id=seq_id)
    msg = forward_backward_request_to_proto(request)
    msg.forward_only = forward_only
    return msg.SerializeToString()


def decode(body: bytes, encoding: str | None = None, zstd_enabled: bool = False):
    return decode_forward_backward_request(body, encoding, zstd_enabled=zstd_enabled)


def text_datum(tokens: list[int], **inputs) -> sdk.Datum:
    return sdk.Datum(model_input=sdk.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def test_dense_lists_decode_to_int64_and_float32():
    datum = text_datum([5, 6, 7], target_tokens=[6, 7, 8], weights=[0.0, 1.0, 0.5])
    model_id, seq_id, fb = decode(sdk_body([datum], model_id="abc:train:3", seq_id=7))
    assert (model_id, seq_id) == ("abc:train:3", 7)
    assert fb.loss_fn == "cross_entropy" and fb.forward_only is False and fb.loss_fn_config == {}
    (d,) = fb.data
    assert d.model_input.chunks == (TextChunk((5, 6, 7)),)
    assert d.loss_fn_inputs["target_tokens"].dtype == np.int64
    assert d.loss_fn_inputs["weights"].dtype == np.float32
    np.testing.assert_array_equal(d.loss_fn_inputs["target_tokens"], [6, 7, 8])
    np.testing.assert_array_equal(d.loss_fn_inputs["weights"], np.array([0, 1, 0.5], np.float32))
    d.loss_fn_inputs["weights"][0] = 2.0  # decoded arrays are writable


def test_large_token_ids_and_negative_values_survive():
    datum = text_datum([0, 2**31 - 1], target_tokens=np.array([2**40, -3]), advantages=[-1.5, 2.25])
    _, _, fb = decode(sdk_body([datum], loss_fn="importance_sampling"))
    assert fb.data[0].model_input.chunks == (TextChunk((0, 2**31 - 1)),)
    np.testing.assert_array_equal(fb.data[0].loss_fn_inputs["target_tokens"], [2**40, -3])
    np.testing.assert_array_equal(fb.data[0].loss_fn_inputs["advantages"], [-1.5, 2.25])


def test_two_dimensional_sparse_torch_targets_use_csr_and_densify_with_zero():
    targets = torch.zeros((6, 4), dtype=torch.int64)
    targets[0, 1], targets[3, 0], targets[5, 3] = 11, 12, 13
    weights = torch.zeros((6, 4), dtype=torch.float32)
    weights[0, 1], weights[5, 3] = 1.0, 0.25
    datum = text_datum(list(range(6)), target_tokens=targets, weights=weights)
    msg = pb.ForwardBackwardRequest.FromString(sdk_body([datum]))
    assert msg.data[0].loss_fn_inputs["target_tokens"].WhichOneof("encoding") == "sparse_csr"
    assert msg.data[0].loss_fn_inputs["weights"].WhichOneof("encoding") == "sparse_csr"
    _, _, fb = decode(sdk_body([datum]))
    inputs = fb.data[0].loss_fn_inputs
    assert inputs["target_tokens"].dtype == np.int64 and inputs["target_tokens"].shape == (6, 4)
    np.testing.assert_array_equal(inputs["target_tokens"], targets.numpy())
    np.testing.assert_array_equal(inputs["weights"], weights.numpy())


def test_two_dimensional_dense_targets_keep_their_shape():
    targets = torch.arange(12, dtype=torch.int64).reshape(3, 4) + 1
    datum = text_datum([1, 2, 3], target_tokens=targets, weights=torch.ones(3, 4))
    _, _, fb = decode(sdk_body([datum]))
    inputs = fb.data[0].loss_fn_inputs
    assert inputs["target_tokens"].shape == (3, 4) and inputs["weights"].shape == (3, 4)
    np.testing.assert_array_equal(inputs["target_tokens"], targets.numpy())


def test_explicit_sparse_tensor_data_with_an_empty_row():
    td = sdk.TensorData(
        data=[1.5, -2.0],
        dtype="float32",
        shape=[3, 2],
        sparse_crow_indices=[0, 1, 1, 2],
        sparse_col_indices=[1, 0],
    )
    _, _, fb = decode(sdk_body([text_datum([1, 2, 3], weights=td)]))
    np.testing.assert_array_equal(fb.data[0].loss_fn_inputs["weights"], [[0, 1.5], [0, 0], [-2.0, 0]])


def test_image_and_text_chunks_keep_their_order():
    model_input = sdk.ModelInput(
        chunks=[
            sdk.EncodedTextChunk(tokens=[1, 2]),
            sdk.ImageChunk(data=PNG, format="png", expected_tokens=4),
            sdk.ImageChunk(data=b"\xff\xd8jpeg", format="jpeg"),
            sdk.EncodedTextChunk(tokens=[3]),
        ]
    )
    datum = sdk.Datum(model_input=model_input, loss_fn_inputs={"target_tokens": [0] * 8})
    _, _, fb = decode(sdk_body([datum]))
    assert fb.data[0].model_input.chunks == (
        TextChunk((1, 2)),
        ImageChunk(data=PNG, format="png", expected_tokens=4),
        ImageChunk(data=b"\xff\xd8jpeg", format="jpeg", expected_tokens=None),
        TextChunk((3,)),
    )


def test_loss_fn_config_numbers_and_text_come_from_v2():
    config = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "loss_id": "loss-7"}
    _, _, fb = decode(sdk_body([text_datum([1], target_tokens=[1])], loss_fn="ppo", loss_fn_config=config))
    assert fb.loss_fn == "ppo"
    assert fb.loss_fn_config == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "loss_id": "loss-7"}
    assert isinstance(fb.loss_fn_config["clip_low_threshold"], float)


def test_v2_wins_over_the_legacy_map_and_legacy_alone_still_works():
    msg = pb.ForwardBackwardRequest.FromString(sdk_body([text_datum([1], target_tokens=[1])]))
    msg.loss_fn_config["beta"] = 1.0
    msg.loss_fn_config["only_legacy"] = 3.0
    msg.loss_fn_config_v2["beta"].number = 2.0
    _, _, fb = decode(msg.SerializeToString())
    assert fb.loss_fn_config == {"beta": 2.0, "only_legacy": 3.0}


def test_forward_only_multiple_datums_and_provenance_spans():
    spans_in = [sdk.PromptProvenanceSpan(sequence_id="s1", offset=0, length=2)]
    spans_out = [sdk.SampledProvenanceSpan(sequence_id="s1", offset=0, length=2)]
    first = text_datum([1, 2], target_tokens=[2, 3]).with_provenance(
        model_input=spans_in, loss_fn_inputs=spans_out
    )
    second = text_datum([4, 5, 6], target_tokens=[5, 6, 7])
    _, _, fb = decode(sdk_body([first, second], forward_only=True))
    assert fb.forward_only is True
    assert [d.model_input.chunks[0].tokens for d in fb.data] == [(1, 2), (4, 5, 6)]


def test_zstd_body_is_decompressed_when_enabled():
    body = sdk_body([text_datum([1, 2, 3], target_tokens=[2, 3, 4])])
    compressed = zstandard.ZstdCompressor().compress(body)
    _, _, fb = decode(compressed, "zstd", zstd_enabled=True)
    np.testing.assert_array_equal(fb.data[0].loss_fn_inputs["target_tokens"], [2, 3, 4])
    _, _, fb = decode(body, "identity", zstd_enabled=True)
    assert len(fb.data) == 1


def _tensor_request(tensor: pb.Tensor, *, name: str = "weights") -> bytes:
    msg = pb.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn="cross_entropy")
    datum = msg.data.add()
    datum.model_input.add().encoded_text.tokens = np.array([1, 2], "<i4").tobytes()
    datum.loss_fn_inputs[name].CopyFrom(tensor)
    return msg.SerializeToString()


def test_int32_and_bfloat16_tensors_widen():
    ints = pb.Tensor(dtype=pb.DTYPE_INT32, dense=np.array([[1, -2], [3, 4]], "<i4").tobytes(), shape=[2, 2])
    _, _, fb = decode(_tensor_request(ints, name="target_tokens"))
    arr = fb.data[0].loss_fn_inputs["target_tokens"]
    assert arr.dtype == np.int64 and arr.tolist() == [[1, -2], [3, 4]]
    values = np.array([1.0, -2.5, 0.15625], np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")
    _, _, fb = decode(_tensor_request(pb.Tensor(dtype=pb.DTYPE_BFLOAT16, dense=bf16.tobytes(), shape=[3])))
    arr = fb.data[0].loss_fn_inputs["weights"]
    assert arr.dtype == np.float32
    np.testing.assert_array_equal(arr, values)


# ---------------------------------------------------------------------------------------------
# Malformed bodies


def _bad(body: bytes, match: str, encoding: str | None = None, zstd_enabled: bool = False) -> None:
    with pytest.raises(UserError, match=match):
        decode(body, encoding, zstd_enabled)


def test_garbage_and_empty_bodies_are_user_errors():
    _bad(b"\xff\xff\xff\xff not a protobuf", "protobuf|model_id")
    _bad(b"", "model_id")
    _bad(b'{"model_id": "m"}', "protobuf|model_id")


def test_missing_fields_and_bad_seq_id():
    good = pb.ForwardBackwardRequest.FromString(sdk_body([text_datum([1], target_tokens=[1])]))
    for field, value, match in [
        ("model_id", "", "model_id"),
        ("seq_id", 0, "seq_id"),
        ("seq_id", -4, "seq_id"),
        ("loss_fn", "", "loss_fn"),
    ]:
        msg = pb.ForwardBackwardRequest()
        msg.CopyFrom(good)
        setattr(msg, field, value)
        _bad(msg.SerializeToString(), match)
    msg = pb.ForwardBackwardRequest()
    msg.CopyFrom(good)
    del msg.data[:]
    _bad(msg.SerializeToString(), "no data")


def test_content_encoding_errors():
    body = sdk_body([text_datum([1], target_tokens=[1])])
    _bad(zstandard.ZstdCompressor().compress(body), "not enabled", "zstd", zstd_enabled=False)
    _bad(b"definitely not zstd", "zstd", "zstd", zstd_enabled=True)
    _bad(body, "Content-Encoding", "gzip", zstd_enabled=True)


@pytest.mark.parametrize(
    ("tensor", "match"),
    [
        (pb.Tensor(dtype=pb.DTYPE_FLOAT32, dense=b"\x00" * 7, shape=[2]), "whole number"),
        (pb.Tensor(dtype=pb.DTYPE_FLOAT32, dense=b"\x00" * 8, shape=[3]), "needs 3 values"),
        (pb.Tensor(dtype=pb.DTYPE_FLOAT32, dense=b"\x00" * 8, shape=[-1, -2]), "negative"),
        (pb.Tensor(dtype=pb.DTYPE_UNSPECIFIED, dense=b"\x00" * 8, shape=[2]), "dtype"),
        (pb.Tensor(dtype=99, dense=b"\x00" * 8, shape=[2]), "dtype"),
    ],
)
def test_bad_dense_tensors(tensor: pb.Tensor, match: str):
    _bad(_tensor_request(tensor), f"datum 0: loss_fn_inputs\\['weights'\\].*{match}")


def _csr(values, crow, col, shape, dtype=pb.DTYPE_FLOAT32) -> pb.Tensor:
    np_dtype = "<f4" if dtype == pb.DTYPE_FLOAT32 else "<i8"
    tensor = pb.Tensor(dtype=dtype, shape=shape)
    tensor.sparse_csr.values = np.array(values, np_dtype).tobytes()
    tensor.sparse_csr.crow_indices = np.array(crow, "<i8").tobytes()
    tensor.sparse_csr.col_indices = np.array(col, "<i8").tobytes()
    return tensor


@pytest.mark.parametrize(
    ("tensor", "match"),
    [
        (_csr([1.0], [0, 1], [0], [2, 2]), "crow_indices has 2"),
        (_csr([1.0], [0, 1, 1], [5], [2, 2]), "column index"),
        (_csr([1.0, 2.0], [0, 1, 1], [0], [2, 2]), "2 CSR values but 1"),
        (_csr([1.0], [0, 2, 1], [0], [2, 2]), "never decrease"),
        (_csr([1.0], [0, 1], [0], [2]), "2-D"),
        (_csr([1.0], [0, 1], [0], [1 << 20, 1 << 20]), "more than"),
    ],
)
def test_bad_csr_tensors(tensor: pb.Tensor, match: str):
    _bad(_tensor_request(tensor), match)


def test_bad_chunks():
    def body_with(fill) -> bytes:
        msg = pb.ForwardBackwardRequest(model_id="m", seq_id=1, loss_fn="cross_entropy")
        msg.data.add()  # datum 0 is fine
        msg.data[0].model_input.add().encoded_text.tokens = b"\x01\x00\x00\x00"
        fill(msg.data.add())
        return msg.SerializeToString()

    _bad(
        body_with(lambda d: setattr(d.model_input.add().encoded_text, "tokens", b"\x01\x00")),
        "datum 1: .*whole number",
    )
    _bad(body_with(lambda d: setattr(d.model_input.add().dmel, "dmel", b"xx")), "dmel")
    _bad(body_with(lambda d: d.model_input.add()), "no content")
    _bad(
        body_with(lambda d: d.model_input.add().image.CopyFrom(pb.ImageChunk(data=PNG, format="gif"))),
        "format",
    )
    _bad(body_with(lambda d: d.model_input.add().image.CopyFrom(pb.ImageChunk(format="png"))), "no data")
    _bad(body_with(lambda d: d.loss_fn_inputs["weights"].dense), "datum 1: model_input is empty")


def test_loss_fn_input_spans_decode_in_order():
    datum = text_datum([5, 6, 7, 8], target_tokens=[6, 7, 8, 9], advantages=[0.0, 0.0, 1.0, 1.0]).with_provenance(
        model_input=[sdk.PromptProvenanceSpan(sequence_id="s:0:1", length=3),
                     sdk.SampledProvenanceSpan(sequence_id="s:0:1", length=1)],
        loss_fn_inputs=[sdk.PromptProvenanceSpan(sequence_id="s:0:1", offset=1, length=2),
                        sdk.SampledProvenanceSpan(sequence_id="s:0:1", length=2)],
    )
    (d,) = decode(sdk_body([datum], loss_fn="stable_reinforce"))[2].data
    assert d.loss_fn_input_spans == (
        ProvenanceSpan("s:0:1", 1, 2, sampled=False),
        ProvenanceSpan("s:0:1", 0, 2, sampled=True),
    )
    (plain,) = decode(sdk_body([text_datum([5], target_tokens=[6])]))[2].data
    assert plain.loss_fn_input_spans == ()
