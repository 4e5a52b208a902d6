"""Gloo transfer groups on 127.0.0.1: the sender in this process, receivers in subprocesses."""

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
import torch
from weight_sync_helpers import ReceiverProcess, assert_same, make_init, mixed_weights

from tx.inference.weight_sync import (
    BroadcastReceiver,
    BroadcastSender,
    WeightSyncError,
    layout_buckets,
    plan_update,
)


def test_mixed_dtypes_across_buckets_arrive_exactly(tmp_path, receivers):
    weights = mixed_weights()
    update = plan_update(weights, bucket_bytes=8 << 10)
    assert len(layout_buckets(update.tensors, update.bucket_bytes)) > 4
    init = make_init()
    receivers.append(ReceiverProcess(tmp_path, rank=1, groups=[(init, update)]))
    sender = BroadcastSender(init)
    sender.connect()
    sender.send(weights, update)
    sender.close()
    assert_same(weights, receivers[0].result())


def test_two_receivers_in_a_world_of_three(tmp_path, receivers):
    weights = mixed_weights(seed=1)
    update = plan_update(weights, bucket_bytes=16 << 10)
    init = make_init(world_size=3)
    receivers += [ReceiverProcess(tmp_path, rank=r, groups=[(init, update)]) for r in (1, 2)]
    sender = BroadcastSender(init)
    sender.connect()
    sender.send(weights, update)
    sender.close()
    for receiver in receivers:
        assert_same(weights, receiver.result())


def test_a_new_group_after_the_first_is_closed(tmp_path, receivers):
    """The restart case: the trainer closes a group and builds a new one (new name, new store)."""
    first, second = mixed_weights(seed=2), mixed_weights(seed=3)
    init1, init2 = make_init(group_name="engines-0"), make_init(group_name="engines-1")
    update = plan_update(first, bucket_bytes=32 << 10)
    receivers.append(ReceiverProcess(tmp_path, rank=1, groups=[(init1, update), (init2, update)]))
    for init, weights in ((init1, first), (init2, second)):
        sender = BroadcastSender(init)
        sender.connect()
        sender.send(weights, update)
        sender.close()
    assert_same(first, receivers[0].result(0))
    assert_same(second, receivers[0].result(1))


def test_received_views_stay_valid_by_default():
    weights = mixed_weights(seed=4)
    update = plan_update(weights, bucket_bytes=4 << 10)
    with _connected_pair(make_init()) as (sender, receiver):
        received = {}
        thread = threading.Thread(target=lambda: received.update(receiver.receive(update)))
        thread.start()
        sender.send(weights, update)
        thread.join(30)
        assert_same(weights, received)


def test_repeated_pushes_in_one_group_reuse_buffers():
    with _connected_pair(make_init()) as (sender, receiver):
        for step in range(3):
            weights = mixed_weights(seed=10 + step)
            update = plan_update(weights, bucket_bytes=4 << 10)
            assert_same(weights, _push(sender, receiver, weights, update, reuse_buffers=True))


def test_a_missing_receiver_times_out_with_a_clear_error():
    sender = BroadcastSender(make_init(group_name="lonely", timeout_s=1.5))
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match="could not join transfer group 'lonely'"):
        sender.connect()
    assert time.monotonic() - start < 20
    sender.close()


def test_a_missing_sender_times_out_on_the_receiver():
    init = make_init(group_name="orphan", timeout_s=1.5)
    receiver = BroadcastReceiver(init, rank=1, device=torch.device("cpu"))
    with pytest.raises(WeightSyncError, match="rank 1 could not join transfer group 'orphan'"):
        receiver.connect()


def test_a_receiver_that_dies_fails_the_send(tmp_path, receivers):
    weights = mixed_weights()
    update = plan_update(weights, bucket_bytes=8 << 10)
    init = make_init(timeout_s=30)  # the receiver process must start and join within it, on a busy CI box too
    receivers.append(ReceiverProcess(tmp_path, rank=1, groups=[(init, update)], mode="exit_after_connect"))
    sender = BroadcastSender(init)
    sender.connect()
    receivers[0].wait()
    with pytest.raises(WeightSyncError, match="broadcast in group"):
        sender.send(weights, update)
    sender.close()


def test_send_checks_tensors_against_the_update_before_the_wire():
    with _connected_pair(make_init()) as (sender, receiver):
        update = plan_update([("w", torch.zeros(2, 2))])
        with pytest.raises(WeightSyncError, match="update says float32"):
            sender.send([("w", torch.zeros(2, 3))], update)
        with pytest.raises(WeightSyncError, match="not given"):
            sender.send([("v", torch.zeros(2, 2))], update)


def test_unconnected_use_and_bad_ranks_are_errors():
    init = make_init(world_size=3)
    with pytest.raises(ValueError, match="outside"):
        BroadcastReceiver(init, rank=0, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="outside"):
        BroadcastReceiver(init, rank=3, device=torch.device("cpu"))
    with pytest.raises(WeightSyncError, match="not connected"):
        BroadcastSender(init).send([], plan_update([]))


@contextlib.contextmanager
def _connected_pair(init) -> Iterator[tuple[BroadcastSender, BroadcastReceiver]]:
    """A sender and a rank-1 cpu receiver of `init`, connected; both closed afterwards."""
    sender, receiver = BroadcastSender(init), BroadcastReceiver(init, rank=1, device=torch.device("cpu"))
    _connect_both(sender, receiver)
    try:
        yield sender, receiver
    finally:
        sender.close()
        receiver.close()


def _connect_both(sender: BroadcastSender, receiver: BroadcastReceiver) -> None:
    thread = threading.Thread(target=receiver.connect)
    thread.start()
    sender.connect()
    thread.join(30)


def _large_and_small_weights() -> list[tuple[str, torch.Tensor]]:
    """Tensors above and below plan.DIRECT_BYTES: sent straight from memory or packed."""
    gen = torch.Generator().manual_seed(5)
    big = torch.randn(600, 1000, generator=gen)  # 2.4 MB
    return [
        ("small.0", torch.randn(7, generator=gen).to(torch.bfloat16)),
        ("big.contiguous", big),
        ("big.transposed", torch.randn(700, 500, generator=gen).t()),  # not contiguous: packed
        ("big.bf16", torch.randn(1 << 20, generator=gen).to(torch.bfloat16)),  # exactly 2 MB
        ("empty", torch.empty(0)),
        ("small.1", torch.randint(0, 2**30, (5, 3), generator=gen)),
        ("huge", torch.randn(3 << 20, generator=gen)),  # 12 MB: larger than a bucket, 3 gloo chunks
        ("mask", torch.rand(9, generator=gen) > 0.5),
        ("big.int8", torch.randint(-128, 127, (3 << 20,), dtype=torch.int8, generator=gen)),
    ]


@pytest.mark.parametrize("reuse_buffers", [False, True])
def test_large_tensors_sent_from_their_own_memory_arrive_exactly(reuse_buffers):
    weights = _large_and_small_weights()
    update = plan_update(weights, bucket_bytes=4 << 20)
    assert [len(b.specs) for b in layout_buckets(update.tensors, update.bucket_bytes)] == [3, 3, 1, 2]
    with _connected_pair(make_init()) as (sender, receiver):
        for _ in range(2):  # the second push reuses the sender's (and with reuse_buffers the receiver's) buffers
            assert_same(weights, _push(sender, receiver, weights, update, reuse_buffers=reuse_buffers))


def test_an_update_of_no_tensors_and_of_only_empty_tensors():
    with _connected_pair(make_init()) as (sender, receiver):
        empty = [("e", torch.empty(0, 3)), ("f", torch.empty(0, dtype=torch.int64))]
        tail = [("w", torch.arange(10.0))]  # the group still works after pushes that moved no bytes
        for weights in ([], empty, tail):
            assert_same(weights, _push(sender, receiver, weights, plan_update(weights)))


def test_large_tensors_land_straight_in_their_targets():
    """Targets (say, a model's parameters) of tensors sent as pieces of their own are filled in place and
    yielded as themselves; a target of a packed tensor, or of the wrong shape or dtype, is left alone."""
    weights = _large_and_small_weights()
    update = plan_update(weights, bucket_bytes=4 << 20)
    targets = {name: torch.zeros_like(t).contiguous() for name, t in weights}
    targets["big.int8"] = torch.zeros(3 << 20, dtype=torch.int16)  # wrong dtype: received into a buffer
    with _connected_pair(make_init()) as (sender, receiver):
        landed: dict[str, torch.Tensor] = {}
        received = _push(sender, receiver, weights, update, targets=targets, landed=landed)
        assert_same(weights, received)
        straight = {"big.contiguous", "big.transposed", "big.bf16", "huge"}  # the sender packs the transposed one
        assert {n for n, t in landed.items() if t is targets[n]} == straight
        for name in straight:
            assert torch.equal(targets[name], dict(weights)[name])
        assert not targets["small.0"].any() and not targets["mask"].any()
        assert not targets["big.int8"].any()


def _push(sender, receiver, weights, update, reuse_buffers: bool = False, targets=None,
          landed: dict | None = None) -> dict[str, torch.Tensor]:
    """Send in this thread while another receives; the received tensors, cloned (`landed`: as yielded)."""
    received: dict[str, torch.Tensor] = {}

    def receive() -> None:
        for name, tensor in receiver.receive(update, reuse_buffers=reuse_buffers, targets=targets):
            if landed is not None:
                landed[name] = tensor
            received[name] = tensor.clone()

    thread = threading.Thread(target=receive)
    thread.start()
    sender.send(weights, update)
    thread.join(60)
    return received
