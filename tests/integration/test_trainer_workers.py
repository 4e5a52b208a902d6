"""`tx serve --trainer-workers 2` through the SDK when a worker dies: a clear error, and the server carries on."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import tinker
from tinker import types

from txserver import API_KEY, TxServer

BASE = "tiny-qwen3"
DATA = [
    types.Datum(
        model_input=types.ModelInput.from_ints(list(range(10, 26))),
        loss_fn_inputs={"target_tokens": list(range(11, 27)), "weights": [1.0] * 16},
    )
]


def worker_pid(server: TxServer, rank: int) -> int:
    """The pid of the server's trainer worker `rank` (a child process running tx's worker module)."""
    for proc in Path("/proc").iterdir():
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # not a process, or gone
        if ppid == server.proc.pid and b"tx.backends.torch.workers.worker" in argv:
            if argv[argv.index(b"--rank") + 1] == str(rank).encode():
                return int(proc.name)
    raise AssertionError(f"tx serve (pid {server.proc.pid}) has no trainer worker {rank}")


def test_a_killed_worker_fails_the_step_and_runs_restore_from_checkpoints(workers_server: TxServer) -> None:
    client = tinker.ServiceClient(base_url=workers_server.url, api_key=API_KEY)
    try:
        tc = client.create_lora_training_client(BASE, rank=4, seed=0).result()
        tc.forward_backward(DATA, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        path = tc.save_state("before-the-crash").result().path
        expected = tc.forward(DATA, "cross_entropy").result().metrics["loss:sum"]

        os.kill(worker_pid(workers_server, 1), signal.SIGKILL)
        with pytest.raises(Exception, match=r"trainer worker 1 .*died"):
            tc.forward_backward(DATA, "cross_entropy").result()
        with pytest.raises(Exception, match="create_training_client_from_state"):
            tc.forward(DATA, "cross_entropy").result()

        restored = client.create_training_client_from_state_with_optimizer(
            path
        ).result()  # a new worker group
        assert restored.forward(DATA, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(
            expected, 1e-5
        )
    finally:
        client.close("success")
