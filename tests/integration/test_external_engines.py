"""External engines (`tx serve --engine-url`): engines a user started with `tx engine serve`, on loopback ports.

One fleet for the module, started as a user would: two embedded engines and, where vLLM is installed, one vLLM
engine (`tx engine serve --kind vllm`, tx's worker extension inside). The vLLM start (40-115 s on CPU) runs
while the startup-error tests use the embedded engines. Then one `tx serve` samples from all of them: the
sampler's logprobs equal the trainer's on every engine, the RL toy task learns, and a SIGKILLed engine loses no
request, is not restarted by tx, and rejoins with the current weights once its user restarts it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from live_engine import vllm_missing
from rl_toy import assert_reward_rose, run_rl_toy
from sdk_datums import sft_datum
from tinker import types
from txserver import TxServer, free_port, stop_group, wait_healthy

pytestmark = pytest.mark.slow
SECRET = "external-engines-test-secret"
LOGPROB_ATOL = 1e-3


class UserEngine:
    """One `tx engine serve` process, started (and restarted) on a fixed loopback port."""

    def __init__(self, model_dir: Path, log_dir: Path, kind: str = "embedded", extra: list[str] | None = None,
                 secret: str = SECRET) -> None:
        self.model_dir, self.log_dir, self.kind, self.secret = model_dir, log_dir, kind, secret
        self.extra = extra or []
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> UserEngine:
        cmd = [sys.executable, "-m", "tx.cli", "engine", "serve", "--kind", self.kind, "--model",
               str(self.model_dir), "--port", str(self.port), *self.extra]
        env = {**os.environ, "TX_ENGINE_SECRET": self.secret}
        with open(self.log_dir / f"engine-{self.kind}-{self.port}.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait(self, timeout_s: float = 240.0) -> UserEngine:
        assert self.proc is not None
        wait_healthy(f"engine {self.url}", self.url + "/health", self.proc, timeout_s, self.log)
        return self

    def log(self) -> str:
        return "".join(p.read_text(errors="replace")[-3000:] for p in self.log_dir.glob(f"engine-*-{self.port}.log"))

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        stop_group(self.proc, 30)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tx.models.tiny import write_tiny_text_model

    return write_tiny_text_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3", preset="tiny", seed=0)


@pytest.fixture(scope="module")
def fleet(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[UserEngine]]:
    """[embedded, embedded, vllm (started, maybe not ready yet; absent without vLLM)]."""
    logs = tmp_path_factory.mktemp("engine-logs")
    engines = []
    if vllm_missing() is None:
        vllm_flags = ["--max-model-len", "512", "--max-adapters", "4", "--vllm-arg=--max-num-seqs=16",
                      "--vllm-arg=--max-lora-rank=8"]
        engines.append(UserEngine(model_dir, logs, "vllm", vllm_flags).start())
    embedded = [UserEngine(model_dir, logs).start() for _ in range(2)]
    try:
        for engine in embedded:
            engine.wait()
        yield embedded + engines
    finally:
        for engine in embedded + engines:
            engine.stop()


def failed_start(tmp_path: Path, args: list[str], env: dict[str, str]) -> str:
    """The log of a `tx serve` that must refuse to start."""
    with pytest.raises(RuntimeError, match="exited") as failure:
        TxServer(tmp_path, args=args, env=env).start(timeout_s=60)
    return str(failure.value)


def test_wrong_secret_is_a_startup_error(fleet: list[UserEngine], model_dir: Path, tmp_path: Path) -> None:
    log = failed_start(tmp_path, ["--base-model", str(model_dir), "--engine-url", fleet[0].url],
                       {"TX_ENGINE_SECRET": "not-the-secret"})
    assert f"engine {fleet[0].url} refused the cluster secret" in log, log


def test_wrong_model_and_unreachable_are_startup_errors(fleet: list[UserEngine], tmp_path: Path) -> None:
    from tx.models.tiny import write_tiny_text_model

    other = write_tiny_text_model(tmp_path / "other-model", preset="tiny", seed=1)  # same shapes, other weights
    dead = f"http://127.0.0.1:{free_port()}"
    log = failed_start(tmp_path / "data", ["--base-model", str(other), "--engine-url", fleet[0].url,
                                           "--engine-url", dead], {"TX_ENGINE_SECRET": SECRET})
    assert f"engine {fleet[0].url} serves model" in log and "none of the base models" in log, log
    assert f"engine {dead} is unreachable" in log, log


@pytest.fixture(scope="module")
def server(fleet: list[UserEngine], model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    for engine in fleet:
        engine.wait()
    args = ["--base-model", str(model_dir), "--engine-probe-interval-s", "0.5"]
    for engine in fleet:
        args += ["--engine-url", engine.url]
    env = {"TX_ENGINE_SECRET": SECRET, "TX_ENGINE_MAX_ADAPTERS": "4"}  # the vLLM engine's --max-adapters
    with TxServer(tmp_path_factory.mktemp("tx-external"), args=args, env=env) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: TxServer) -> Iterator[tinker.ServiceClient]:
    with server.client() as c:
        yield c


def engines(server: TxServer) -> dict[str, dict]:
    """The external engines by URL, as /api/v1/tx/engines shows them."""
    (group,) = server.engine_groups()
    return {e["url"]: e for e in group["engines"]}


def server_model(server: TxServer) -> str:
    return server.engine_groups()[0]["base_model"]


def served_requests(server: TxServer) -> dict[str, int]:
    return {url: (e.get("health") or {}).get("stats", {}).get("num_requests", 0) for url, e in engines(server).items()}


def assert_matches_trainer(tc: tinker.TrainingClient, sampler: tinker.SamplingClient) -> None:
    prompt = [40, 41, 42, 43, 44]
    out = sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=6)).result()
    for seq in out.sequences:
        full = prompt + list(seq.tokens)
        train = tc.forward([sft_datum(full)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        np.testing.assert_allclose(seq.logprobs, train[len(prompt) - 1:], atol=LOGPROB_ATOL)


def until_each_engine_served(server: TxServer, client: tinker.ServiceClient, tc: tinker.TrainingClient,
                             path: str, urls: list[str], tries: int = 40) -> None:
    """New sampling sessions (each routed on its own) on `path` until every engine in `urls` served one of
    them; each session's logprobs must equal the trainer's."""
    before = served_requests(server)
    for _ in range(tries):
        assert_matches_trainer(tc, client.create_sampling_client(model_path=path))
        now = served_requests(server)
        if all(now[url] > before.get(url, 0) for url in urls):
            return
    raise AssertionError(f"not every engine served a session in {tries} tries: {before} -> {now}")


def test_engines_are_listed_as_external_and_up(server: TxServer, fleet: list[UserEngine]) -> None:
    listed = engines(server)
    assert set(listed) == {e.url for e in fleet}
    for info in listed.values():
        assert info["external"] is True and info["state"] == "up" and info["pid"] is None, info


def test_sampler_logprobs_match_trainer_on_every_engine(server: TxServer, client: tinker.ServiceClient,
                                                       fleet: list[UserEngine]) -> None:
    tc = client.create_lora_training_client(server_model(server), rank=8, seed=1).result()
    for _ in range(2):
        tc.forward_backward([sft_datum([40, 41, 42, 43, 44, 45, 46])], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    path = tc.save_weights_for_sampler("trained").result().path
    until_each_engine_served(server, client, tc, path, [e.url for e in fleet])


def test_rl_toy_task_learns_on_external_engines(server: TxServer, client: tinker.ServiceClient) -> None:
    """With the cookbook's default loss: every sample recorded on the way through external engines."""
    assert_reward_rose(run_rl_toy(client, server_model(server), loss_fn="stable_reinforce"))


def test_killed_engine_loses_no_request_and_rejoins(server: TxServer, client: tinker.ServiceClient,
                                                    fleet: list[UserEngine]) -> None:
    tc = client.create_lora_training_client(server_model(server), rank=8, seed=2).result()
    path = tc.save_weights_for_sampler("before-kill").result().path
    results: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def sample_in_a_loop(i: int) -> None:
        sampler = client.create_sampling_client(model_path=path)
        try:
            while not stop.is_set():
                out = sampler.sample(types.ModelInput.from_ints([20 + i, 21, 22]), 2,
                                     types.SamplingParams(max_tokens=24, temperature=1.0)).result(timeout=120)
                results.append(len(out.sequences))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    before = served_requests(server)
    threads = [threading.Thread(target=sample_in_a_loop, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    time.sleep(3)
    served = served_requests(server)
    embedded = [e for e in fleet if e.kind == "embedded"]
    victim = max(embedded, key=lambda e: served[e.url] - before[e.url])  # the one serving more of the 8 now
    victim.kill()
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert results and all(n == 2 for n in results)

    listed = engines(server)[victim.url]
    assert listed["state"] == "down" and listed["pid"] is None, listed
    with pytest.raises(httpx.HTTPError):
        httpx.get(victim.url + "/health", timeout=2)  # tx did not start anything in its place

    for _ in range(2):  # the weights move on while the engine is down
        tc.forward_backward([sft_datum([50, 51, 52, 53, 54])], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    current = tc.save_weights_for_sampler("after-kill").result().path

    victim.start().wait()
    deadline = time.monotonic() + 30
    while engines(server)[victim.url]["state"] != "up":
        assert time.monotonic() < deadline, engines(server)[victim.url]
        time.sleep(0.3)
    until_each_engine_served(server, client, tc, current, [victim.url])
