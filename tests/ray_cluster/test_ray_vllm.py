"""`tx serve --engine vllm --ray-address local`: vLLM engines as Ray actors, through the real SDK.

One server for the module (a vLLM start is ~30 s on CPU). The tests run in order: a sample that matches the
trainer, then a killed actor (the engine restarts through Ray, nothing of the old vLLM is left), then the
server stops and no process remains that any engine started (each runs in its run dir under the data dir).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types
from live_engine import vllm_missing
from txserver import TxServer

ray = pytest.importorskip("ray")
if not hasattr(ray, "init"):
    pytest.skip("ray is not installed (pip install 'tx[ray]')", allow_module_level=True)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.ray]
BASE = "tiny-qwen3"
LOGPROB_ATOL = 1e-3
PROMPT = [40, 41, 42, 43, 44]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    server = TxServer(tmp_path_factory.mktemp("tx-ray-vllm") / "data",
                      args=["--engine", "vllm", "--ray-address", "local"], env={"RAY_AUTH_MODE": "disabled"})
    with server.start(timeout_s=180):
        yield server


@pytest.fixture(scope="module")
def training(server: TxServer) -> Iterator[tinker.TrainingClient]:
    with server.client() as client:
        yield client.create_lora_training_client(BASE, rank=8, seed=1).result()


@pytest.fixture(scope="module")
def sampler(training: tinker.TrainingClient) -> tinker.SamplingClient:
    sampler = training.save_weights_and_get_sampling_client()  # starts the engine (a Ray actor) on first use
    return sampler.result() if hasattr(sampler, "result") else sampler


def _engines(server: TxServer) -> list[dict]:
    (group,) = server.engine_groups()
    return group["engines"]


def _sample_matches_trainer(tc: tinker.TrainingClient, sampler: tinker.SamplingClient) -> None:
    out = sampler.sample(types.ModelInput.from_ints(PROMPT), 1, types.SamplingParams(max_tokens=6)).result()
    (seq,) = out.sequences
    full = PROMPT + list(seq.tokens)
    datum = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)})
    train = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(seq.logprobs, train[len(PROMPT) - 1:], atol=LOGPROB_ATOL)


def _proc(pid: int, what: str) -> str:
    return Path(f"/proc/{pid}/{what}").read_text()


def _group_members(pgid: int) -> set[int]:
    """Live processes in process group `pgid` (the vLLM engine's session: tx's process, vLLM and its own)."""
    members = set()
    for entry in Path("/proc").iterdir():
        try:
            stat = _proc(int(entry.name), "stat").rsplit(")", 1)[1].split()
        except (ValueError, OSError):
            continue
        if int(stat[2]) == pgid and stat[0] != "Z":
            members.add(int(entry.name))
    return members


def _started_under(root: Path) -> list[str]:
    """Command lines of live processes whose working directory is under `root` (what the engines ran)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cwd = os.readlink(entry / "cwd")
            cmdline = _proc(int(entry.name), "cmdline").replace("\0", " ")
        except (ValueError, OSError):
            continue
        if cwd.startswith(str(root)):
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def _wait(condition, timeout_s: float, message) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, message()
        time.sleep(0.2)


def test_sample_through_a_ray_placed_vllm_engine_matches_the_trainer(server, training, sampler) -> None:
    _sample_matches_trainer(training, sampler)
    (engine,) = _engines(server)
    assert engine["alive"] and engine["health"]["status"].startswith("ok"), engine
    cwd = Path(os.readlink(f"/proc/{engine['pid']}/cwd"))
    assert cwd.is_relative_to((server.data_dir / "engines").resolve())  # the actor's run dir, under the server's data dir


def test_killed_actor_takes_vllm_with_it_and_the_engine_restarts(server, training, sampler) -> None:
    (engine,) = _engines(server)
    vllm_group = _group_members(engine["pid"])  # tx's engine process leads its own group
    assert len(vllm_group) >= 3, vllm_group  # tx's process, its watcher, vLLM's server (and engine core)
    actor_pid = int(_proc(engine["pid"], "stat").rsplit(")", 1)[1].split()[1])  # the engine's parent
    assert "ray" in _proc(actor_pid, "cmdline").lower()
    os.kill(actor_pid, signal.SIGKILL)
    _wait(lambda: not _group_members(engine["pid"]), 60,
          lambda: f"vLLM outlived its actor: {_group_members(engine['pid'])}")

    _sample_matches_trainer(training, sampler)  # the engine restarts through Ray and serves the same weights
    (restarted,) = _engines(server)
    assert restarted["alive"] and restarted["pid"] != engine["pid"]


def test_nothing_an_engine_started_outlives_the_server(server) -> None:
    # Ray SIGKILLs the actors' children here: only the watcher tx's vLLM process leaves in its group ends
    # vLLM's server, engine core and workers (without it they were left behind with parent 1)
    server.stop()
    engines_dir = (server.data_dir / "engines").resolve()
    _wait(lambda: not _started_under(engines_dir), 60,
          lambda: f"left behind: {_started_under(engines_dir)}")
