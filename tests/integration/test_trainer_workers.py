"""`tx serve --trainer-workers 2` through the SDK: engines get rank 0's weights; a dead worker is a clear error."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from tinker import types

from txserver import TxServer

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


def test_samplers_get_the_weights_the_workers_trained(workers_server: TxServer) -> None:
    """The engines receive rank 0's gathered LoRA: sampled logprobs equal the trainer's after training."""
    with workers_server.client() as client:
        tc = client.create_lora_training_client(BASE, rank=4, seed=1).result()
        for _ in range(3):
            tc.forward_backward(DATA, "cross_entropy").result()
            tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
        sampler = tc.save_weights_and_get_sampling_client()
        prompt = list(range(10, 22))
        params = types.SamplingParams(max_tokens=5, temperature=0.7)
        seq = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
        full = prompt + list(seq.tokens)
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(full[:-1]),
            loss_fn_inputs={"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)},
        )
        trained = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        np.testing.assert_allclose(seq.logprobs, trained[len(prompt) - 1 :], atol=1e-3)


def test_a_killed_worker_fails_the_step_and_runs_restore_from_checkpoints(workers_server: TxServer) -> None:
    with workers_server.client() as client:
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
