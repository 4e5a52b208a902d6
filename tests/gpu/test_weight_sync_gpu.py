"""Weight transfer on GPUs: NCCL to a receiver process on a second GPU, CUDA IPC on one shared GPU."""

import subprocess
import sys
import textwrap

import pytest
import torch

from tx.inference.weight_sync import BroadcastSender, IpcSender, TransferInit, free_port, plan_update

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

NCCL_RECEIVER = textwrap.dedent(
    """
    import sys, torch
    from tx.inference.weight_sync import BroadcastReceiver, TransferInit, TransferUpdate
    init_json, update_json, out = sys.stdin.read().split("\\n")[:3]
    device = torch.device("cuda", 1)
    torch.cuda.set_device(device)
    receiver = BroadcastReceiver(TransferInit.model_validate_json(init_json), rank=1, device=device)
    receiver.connect()
    got = {n: t.cpu() for n, t in receiver.receive(TransferUpdate.model_validate_json(update_json))}
    assert all(t.device.type == "cpu" for t in got.values())
    receiver.close()
    torch.save(got, out)
    """
)

IPC_RECEIVER = textwrap.dedent(
    """
    import sys, torch
    from tx.inference.weight_sync import IpcReceiver, IpcUpdate
    update_json, out = sys.stdin.read().split("\\n")[:2]
    receiver = IpcReceiver(torch.device("cuda", 0))
    got = {}
    for name, tensor in receiver.receive(IpcUpdate.model_validate_json(update_json)):
        assert tensor.device.type == "cuda"
        got[name] = tensor.cpu()
    torch.save(got, out)
    """
)


def _weights(device: torch.device) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator(device=device).manual_seed(0)
    weights = []
    for layer in range(4):
        weight = torch.randn(256, 128, device=device, generator=gen).to(torch.bfloat16)
        weights.append((f"l{layer}.w", weight))
        weights.append((f"l{layer}.norm", torch.randn(128, device=device, generator=gen)))
        weights.append((f"l{layer}.h", torch.randn(64, 3, device=device, generator=gen).half()))
    weights.append(("step", torch.tensor(3, device=device)))
    weights.append(("transposed", torch.randn(40, 30, device=device, generator=gen).t()))
    return weights


def _start(code: str, stdin: str) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    proc.stdin.write(stdin)
    proc.stdin.close()
    return proc


def _finish(proc: subprocess.Popen, out, expected) -> None:
    rc = proc.wait(120)
    assert rc == 0, proc.stderr.read()
    got = torch.load(out)
    assert list(got) == [name for name, _ in expected]
    for name, tensor in expected:
        assert torch.equal(got[name], tensor.cpu()), name


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs two GPUs (one rank per GPU)")
def test_nccl_broadcast_to_a_second_gpu(tmp_path):
    device = torch.device("cuda", 0)
    weights = _weights(device)
    update = plan_update(weights, bucket_bytes=64 << 10)
    init = TransferInit(backend="nccl", master_address="127.0.0.1", master_port=free_port(), world_size=2,
                        rank_offset=1, group_name="gpu-test", timeout_s=60)
    out = tmp_path / "nccl.pt"
    proc = _start(NCCL_RECEIVER, f"{init.model_dump_json()}\n{update.model_dump_json()}\n{out}\n")
    try:
        sender = BroadcastSender(init, device=device)
        sender.connect()
        sender.send(weights, update)
        sender.close()
        _finish(proc, out, weights)
    finally:
        proc.kill()


def test_cuda_ipc_on_one_gpu(tmp_path):
    device = torch.device("cuda", 0)
    weights = _weights(device)
    sender = IpcSender(device)
    update = sender.share(weights, bucket_bytes=64 << 10)
    assert len(update.buckets) > 1
    out = tmp_path / "ipc.pt"
    proc = _start(IPC_RECEIVER, f"{update.model_dump_json()}\n{out}\n")
    try:
        _finish(proc, out, weights)  # the buffers stay alive until the receiver is done
    finally:
        proc.kill()
        sender.release()


def test_cuda_ipc_one_bucket_at_a_time(tmp_path):
    device = torch.device("cuda", 0)
    weights = _weights(device)
    sender = IpcSender(device)
    seen = []
    for index, update in enumerate(sender.iter_updates(weights, bucket_bytes=192 << 10)):
        out = tmp_path / f"ipc{index}.pt"
        proc = _start(IPC_RECEIVER, f"{update.model_dump_json()}\n{out}\n")
        assert proc.wait(120) == 0, proc.stderr.read()
        seen += list(torch.load(out).items())
    assert [name for name, _ in seen] == [name for name, _ in weights]
    for (_, got), (_, tensor) in zip(seen, weights):
        assert torch.equal(got, tensor.cpu())
