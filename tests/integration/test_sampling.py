"""Sampling through the SDK: lazy engines, weight sync, logprob agreement, RL, supervision."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from rl_toy import assert_reward_rose, run_rl_toy
from sdk_datums import sft_datum
from tinker import types
from txserver import API_KEY, TxServer

from tx.cpu import split_threads

BASE = "tiny-qwen3"
BOTH_BACKENDS = pytest.mark.parametrize("client", ["torch", "jax"], indirect=True)
VOCAB = 2000  # regular tokens of the tiny tokenizer; specials come after
# Largest |sampler - trainer| logprob of sampled tokens with --train-dtype bfloat16 (the engine follows it),
# in nats. Measured on CPU with the tiny model: 0.014-0.041 over 4 runs (before and after training); an engine
# kept in float32 under that bf16 trainer was off by up to 0.055. Prompt logprobs agree within 1e-3 (measured:
# 0.0, one full pass on either side).
BF16_SAMPLED_GAP = 0.1


def engines(server: TxServer) -> list[dict]:
    return [e for g in server.engine_groups() for e in g["engines"]]


def group_state(server: TxServer) -> str:
    return server.engine_groups()[0]["state"]


@pytest.fixture(scope="module")
def sampling_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    with TxServer(tmp_path_factory.mktemp("tx-sampling"), args=["--no-engine-colocate"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(request: pytest.FixtureRequest) -> Iterator[tinker.ServiceClient]:
    """A client of this module's torch server, or of the jax server for tests marked BOTH_BACKENDS."""
    backend = getattr(request, "param", "torch")
    server = request.getfixturevalue("jax_server" if backend == "jax" else "sampling_server")
    with server.client() as c:
        yield c


def test_sft_only_run_starts_no_engine(sampling_server: TxServer, client: tinker.ServiceClient) -> None:
    tc = client.create_lora_training_client(BASE, rank=4).result()
    data = [sft_datum(list(range(20, 40)))]
    for _ in range(2):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    tc.save_state("sft-only").result()
    assert all(e["pid"] is None for e in engines(sampling_server))
    assert group_state(sampling_server) == "absent"
    standby = _standby_pids(sampling_server)  # started with the server, imports only: no model in it
    assert len(standby) == 1 and not _maps_file(standby[0], "model.safetensors")


def _standby_pids(server: TxServer) -> list[int]:
    """Processes started as this server's standby engine (their output goes to its data dir)."""
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            standby = b"TX_ENGINE_STANDBY=1" in environ.read_bytes().split(b"\0")
            if standby and str(server.data_dir) in os.readlink(environ.with_name("fd") / "1"):
                pids.append(int(environ.parent.name))
        except OSError:
            continue
    return pids


def _maps_file(pid: int, name: str) -> bool:
    return name in Path(f"/proc/{pid}/maps").read_text()


def test_the_first_engine_is_the_standby_started_with_the_server(sampling_server: TxServer,
                                                                 client: tinker.ServiceClient) -> None:
    (standby,) = _standby_pids(sampling_server)
    sampler = client.create_sampling_client(base_model=BASE)
    sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2)).result()
    assert engines(sampling_server)[0]["pid"] == standby, "the standby process became the engine"


def test_the_engine_takes_its_share_of_the_cores(sampling_server: TxServer, client: tinker.ServiceClient) -> None:
    """The trainer and the engine split the machine's threads (tx/cpu.py): the engine runs with its share, never
    with every core while the trainer trains on them too; the standby process that became it too (here the first
    engine is the standby, so it got the share when the server started, before any config). Its OpenMP threads
    sleep while they wait, as the server's do (`tx serve` sets it before anything starts; tx/cpu.py)."""
    sampler = client.create_sampling_client(base_model=BASE)
    sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2)).result()
    environ = dict(
        entry.split("=", 1) for entry in Path(f"/proc/{engines(sampling_server)[0]['pid']}/environ")
        .read_text().split("\0") if "=" in entry
    )
    share = split_threads(None, 1).engine  # this machine's: 1 of 2 cores here
    assert environ["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS", str(share))
    assert environ["OMP_WAIT_POLICY"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    if "TX_ENGINE_CONFIG" in environ:  # a spawned engine (a standby reads its config from its stdin)
        assert json.loads(environ["TX_ENGINE_CONFIG"])["num_threads"] == share
    assert f"the trainer's {split_threads(None, 1).trainer} while a local engine runs" in sampling_server.log()


Gaps = dict[str, float]  # "sampled" / "prompt" -> largest |sampler - trainer| logprob


def sampler_trainer_gaps(client: tinker.ServiceClient) -> tuple[Gaps, Gaps]:
    """The largest |sampler - trainer| logprob of one LoRA run's sampled tokens and of its prompts
    (compute_logprobs), before and after 4 training steps."""
    tc = client.create_lora_training_client(BASE, rank=8, seed=3).result()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, VOCAB, size=12).tolist() for _ in range(3)]

    def gaps() -> Gaps:
        sampler = tc.save_weights_and_get_sampling_client()
        worst = {"sampled": 0.0, "prompt": 0.0}
        for prompt in prompts:
            sampled = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=2,
                                     sampling_params=types.SamplingParams(max_tokens=6, temperature=0.7)).result()
            for seq in sampled.sequences:
                full = prompt + list(seq.tokens)
                trainer = tc.forward([sft_datum(full)], "cross_entropy").result()
                train_lp = trainer.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1:]
                gap = np.abs(np.array(seq.logprobs) - train_lp).max()
                worst["sampled"] = max(worst["sampled"], float(gap))
            prompt_lp = sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()
            train_prompt = tc.forward([sft_datum(prompt)], "cross_entropy").result()
            assert prompt_lp[0] is None
            train_prompt_lp = train_prompt.loss_fn_outputs[0]["logprobs"].to_numpy()
            gap = np.abs(np.array(prompt_lp[1:]) - train_prompt_lp).max()
            worst["prompt"] = max(worst["prompt"], float(gap))
        return worst

    before = gaps()
    for _ in range(4):
        tc.forward_backward([sft_datum(prompts[0] + [7, 8, 9])], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    return before, gaps()


def test_sampler_logprobs_match_trainer_before_and_after_training(client: tinker.ServiceClient) -> None:
    for gaps in sampler_trainer_gaps(client):
        assert max(gaps.values()) < 1e-3, gaps


@pytest.fixture(scope="module")
def bf16_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """Trainer in bfloat16 on CPU; its engine follows the trainer's dtype (no --engine-dtype given)."""
    args = ["--no-engine-colocate", "--train-dtype", "bfloat16"]
    with TxServer(tmp_path_factory.mktemp("tx-bf16"), args=args) as srv:
        yield srv


def test_bf16_sampler_logprobs_match_trainer(bf16_server: TxServer) -> None:
    """In bf16, prompt logprobs (one full pass on either side) agree as in fp32; sampled tokens' agree within
    BF16_SAMPLED_GAP, since the engine decodes one token at a time over a bf16 KV cache (other matmul shapes,
    other rounding) while the trainer scores the sequence in one pass."""
    with bf16_server.client() as client:
        for gaps in sampler_trainer_gaps(client):
            assert gaps["prompt"] < 1e-3 and gaps["sampled"] < BF16_SAMPLED_GAP, gaps


@BOTH_BACKENDS
def test_rl_toy_task_reward_rises(client: tinker.ServiceClient) -> None:
    """Reward = share of sampled tokens in a fixed 5% of the vocabulary: only a working weight sync learns it."""
    assert_reward_rose(run_rl_toy(client, BASE))


def test_killed_engine_is_restarted(sampling_server: TxServer, client: tinker.ServiceClient) -> None:
    sampler = client.create_sampling_client(base_model=BASE)
    params = types.SamplingParams(max_tokens=4, temperature=0.0)
    first = sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, params).result()
    pid = engines(sampling_server)[0]["pid"]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    second = sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, params).result()
    assert second.sequences[0].tokens == first.sequences[0].tokens
    new_pid = engines(sampling_server)[0]["pid"]
    assert new_pid != pid


def test_older_sampling_clients_keep_their_weights(client: tinker.ServiceClient) -> None:
    tc = client.create_lora_training_client(BASE, rank=8, seed=5).result()
    prompt = types.ModelInput.from_ints([30, 31, 32, 33])
    old = tc.save_weights_and_get_sampling_client()
    before = old.compute_logprobs(prompt).result()
    for _ in range(3):
        tc.forward_backward([sft_datum([30, 31, 32, 33, 34])], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    new = tc.save_weights_and_get_sampling_client()
    assert new.compute_logprobs(prompt).result()[1:] != pytest.approx(before[1:], abs=1e-4)
    assert old.compute_logprobs(prompt).result()[1:] == pytest.approx(before[1:], abs=1e-5)


def test_unknown_sampler_and_bad_prompt(client: tinker.ServiceClient, sampling_server: TxServer) -> None:
    sampler = client.create_sampling_client(base_model=BASE)
    with pytest.raises(tinker.RequestFailedError, match="vocab"):
        sampler.sample(types.ModelInput.from_ints([1, 10_000_000]), 1,
                       types.SamplingParams(max_tokens=2)).result(timeout=60)
    r = httpx.post(f"{sampling_server.url}/api/v1/asample", headers={"X-API-Key": API_KEY}, json={
        "sampling_session_id": "nope:sample:0", "seq_id": 0, "num_samples": 1,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
        "sampling_params": {"max_tokens": 2, "temperature": 1.0, "top_k": -1, "top_p": 1.0},
        "prompt_logprobs": False})
    assert r.status_code == 404 and r.json()["detail"]


@pytest.fixture(scope="module")
def colocated_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    with TxServer(tmp_path_factory.mktemp("tx-colocated"),
                  args=["--engine-colocate", "--engine-count", "2"]) as srv:
        yield srv


@pytest.fixture
def colocated_client(colocated_server: TxServer) -> Iterator[tinker.ServiceClient]:
    """A session of its own for each test."""
    with colocated_server.client() as client:
        yield client


def test_colocated_engines_sleep_for_training_and_wake_to_sample(colocated_server: TxServer,
                                                                 colocated_client: tinker.ServiceClient) -> None:
    tc = colocated_client.create_lora_training_client(BASE, rank=4).result()
    prompt = types.ModelInput.from_ints([5, 6, 7])
    sampler = tc.save_weights_and_get_sampling_client()
    sampler.sample(prompt, 1, types.SamplingParams(max_tokens=3)).result()
    assert group_state(colocated_server) == "awake"
    tc.forward_backward([sft_datum([5, 6, 7, 8])], "cross_entropy").result()
    assert group_state(colocated_server) == "asleep"
    assert all(e["health"]["sleeping_level"] == 1 for e in engines(colocated_server)), engines(colocated_server)
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    expected = tc.forward([sft_datum([5, 6, 7, 8])], "cross_entropy").result().loss_fn_outputs[0]
    sampler = tc.save_weights_and_get_sampling_client()  # wakes, pushes the new version
    got = sampler.compute_logprobs(types.ModelInput.from_ints([5, 6, 7, 8])).result()
    assert group_state(colocated_server) == "awake"
    np.testing.assert_allclose(got[1:], expected["logprobs"].to_numpy(), atol=1e-3)


def test_a_sessions_requests_stay_on_one_engine(colocated_server: TxServer,
                                                 colocated_client: tinker.ServiceClient) -> None:
    params = types.SamplingParams(max_tokens=2)

    def counts() -> list[int]:
        return [e["health"]["stats"]["num_requests"] for e in engines(colocated_server)]

    for _ in range(3):
        sampler = colocated_client.create_sampling_client(base_model=BASE)
        before = counts()
        for i in range(4):
            sampler.sample(types.ModelInput.from_ints([1, 2, i + 3]), 1, params).result()
        grown = [a - b for a, b in zip(counts(), before)]
        assert sorted(grown) == [0, 4], grown


def test_a_name_saved_again_serves_the_new_weights(client: tinker.ServiceClient) -> None:
    """Saving under an existing name is a new version: clients made afterwards sample the new weights (before
    versions were counted they sampled the first save's, 4 nats away), and one made before keeps its own."""
    tc = client.create_lora_training_client(BASE, rank=8, seed=7).result()
    tokens = list(range(40, 52))
    prompt = types.ModelInput.from_ints(tokens)

    def trainer_logprobs() -> np.ndarray:
        return tc.forward([sft_datum(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()

    path = tc.save_weights_for_sampler("latest").result().path
    first = client.create_sampling_client(model_path=path).result()
    first_logprobs = first.compute_logprobs(prompt).result()
    np.testing.assert_allclose(first_logprobs[1:], trainer_logprobs(), atol=1e-3)
    for _ in range(3):
        tc.forward_backward([sft_datum(tokens)], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=5e-2)).result()
    assert tc.save_weights_for_sampler("latest").result().path == path
    second = client.create_sampling_client(model_path=path).result()
    gap = np.abs(np.array(second.compute_logprobs(prompt).result()[1:]) - trainer_logprobs()).max()
    assert gap < 1e-3, f"a client made after the second save samples other weights ({gap:.2f} nats off)"
    assert first.compute_logprobs(prompt).result()[1:] == pytest.approx(first_logprobs[1:], abs=1e-5)


def test_a_client_whose_weights_were_dropped_gets_an_error_naming_its_path(client: tinker.ServiceClient) -> None:
    """A run holds its 8 newest versions (--sampler-versions-kept); an older client is told which path to renew."""
    tc = client.create_lora_training_client(BASE, rank=4, seed=9).result()
    path = tc.save_weights_for_sampler("kept").result().path
    old = client.create_sampling_client(model_path=path).result()
    prompt, params = types.ModelInput.from_ints([3, 4, 5]), types.SamplingParams(max_tokens=2)
    old.sample(prompt, 1, params).result()
    for _ in range(8):
        tc.save_weights_for_sampler("kept").result()
    with pytest.raises(tinker.RequestFailedError, match="no longer held") as failure:
        old.sample(prompt, 1, params).result(timeout=60)
    assert path in str(failure.value)
    client.create_sampling_client(model_path=path).result().sample(prompt, 1, params).result()  # a new client works
