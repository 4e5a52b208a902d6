"""Bucket planning and the wire types: pure functions, no groups."""

import pytest
import torch
from pydantic import ValidationError

from tx.inference.weight_sync import (
    IpcSender,
    TensorSpec,
    TransferInit,
    TransferUpdate,
    WeightSyncError,
    dtype_from_name,
    dtype_name,
    layout_buckets,
    plan_update,
    view_in,
)
from tx.inference.weight_sync.plan import ALIGN_BYTES


def test_plan_keeps_order_and_describes_tensors():
    named = [("b", torch.zeros(2, 3, dtype=torch.bfloat16)), ("a", torch.zeros(4, dtype=torch.int64))]
    update = plan_update(named, bucket_bytes=1024)
    described = [(s.name, s.dtype, s.shape) for s in update.tensors]
    assert described == [("b", "bfloat16", [2, 3]), ("a", "int64", [4])]
    assert update.bucket_bytes == 1024
    assert TransferUpdate.model_validate_json(update.model_dump_json()) == update


def test_buckets_respect_the_limit_and_alignment():
    specs = [TensorSpec(name=f"t{i}", dtype="float32", shape=[10]) for i in range(10)]  # 40 bytes each
    buckets = layout_buckets(specs, bucket_bytes=3 * ALIGN_BYTES)
    assert [[s.name for s in b.specs] for b in buckets] == [["t0", "t1", "t2"], ["t3", "t4", "t5"],
                                                           ["t6", "t7", "t8"], ["t9"]]
    for bucket in buckets:
        assert bucket.offsets == [i * ALIGN_BYTES for i in range(len(bucket.specs))]
        assert bucket.nbytes == bucket.offsets[-1] + 40 <= 3 * ALIGN_BYTES


def test_a_tensor_larger_than_a_bucket_travels_alone():
    specs = [
        TensorSpec(name="small", dtype="float16", shape=[4]),
        TensorSpec(name="big", dtype="float32", shape=[1000]),
        TensorSpec(name="tail", dtype="bool", shape=[3]),
    ]
    buckets = layout_buckets(specs, bucket_bytes=256)
    assert [[s.name for s in b.specs] for b in buckets] == [["small"], ["big"], ["tail"]]
    assert buckets[1].nbytes == 4000


def test_mixed_dtypes_share_a_bucket_and_views_round_trip():
    named = [
        ("f", torch.randn(5)),
        ("h", torch.randn(3).half()),
        ("i", torch.arange(4)),
        ("m", torch.tensor([True])),
    ]
    (bucket,) = layout_buckets(plan_update(named).tensors, bucket_bytes=1 << 20)
    buffer = torch.zeros(bucket.nbytes, dtype=torch.uint8)
    for (_, tensor), spec, offset in zip(named, bucket.specs, bucket.offsets):
        view_in(buffer, spec, offset).copy_(tensor)
    for (_, tensor), spec, offset in zip(named, bucket.specs, bucket.offsets):
        assert torch.equal(view_in(buffer, spec, offset), tensor)


def test_dtype_table_is_explicit():
    assert dtype_from_name("bfloat16") is torch.bfloat16
    assert dtype_name(torch.float16) == "float16"
    with pytest.raises(ValueError, match="unsupported dtype"):
        dtype_from_name("float8")
    with pytest.raises(ValueError, match="unsupported dtype"):
        dtype_name(torch.complex64)
    with pytest.raises(ValidationError):
        TensorSpec(name="x", dtype="torch.float32", shape=[1])


def test_plan_rejects_duplicates_and_unknown_dtypes():
    with pytest.raises(ValueError, match="twice"):
        plan_update([("a", torch.zeros(1)), ("a", torch.zeros(1))])
    with pytest.raises(ValueError, match="unsupported dtype"):
        plan_update([("c", torch.zeros(1, dtype=torch.complex64))])


def test_init_validates():
    with pytest.raises(ValidationError):
        TransferInit(backend="mpi", master_address="127.0.0.1", master_port=1, world_size=2, rank_offset=1,
                     group_name="g")
    with pytest.raises(ValidationError):
        TransferInit(backend="gloo", master_address="127.0.0.1", master_port=1, world_size=1, rank_offset=1,
                     group_name="g")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_ipc_without_cuda_is_a_clear_error():
    with pytest.raises(WeightSyncError, match="needs a CUDA GPU"):
        IpcSender()


def test_pieces_send_large_tensors_alone_and_pack_small_runs():
    specs = [
        TensorSpec(name="a", dtype="float32", shape=[10]),  # 40 bytes
        TensorSpec(name="b", dtype="float32", shape=[10]),
        TensorSpec(name="big", dtype="float32", shape=[100]),  # 400 bytes
        TensorSpec(name="none", dtype="float32", shape=[0]),
        TensorSpec(name="c", dtype="int8", shape=[3]),
        TensorSpec(name="big2", dtype="float32", shape=[100]),
    ]
    (bucket,) = layout_buckets(specs, bucket_bytes=1 << 20)
    pieces = bucket.pieces(direct_bytes=400)
    offsets = bucket.offsets
    assert [(p.start, p.end, p.spec) for p in pieces] == [
        (0, offsets[2], None),
        (offsets[2], offsets[2] + 400, 2),
        (offsets[3], offsets[5], None),
        (offsets[5], offsets[5] + 400, 5),
    ]
    assert [(p.start, p.end, p.spec) for p in bucket.pieces(direct_bytes=None)] == [(0, bucket.nbytes, None)]


def test_a_bucket_of_empty_tensors_has_no_pieces():
    (bucket,) = layout_buckets([TensorSpec(name="e", dtype="float32", shape=[0, 4])], bucket_bytes=64)
    assert bucket.nbytes == 0
    assert bucket.pieces() == [] and bucket.pieces(direct_bytes=None) == []
