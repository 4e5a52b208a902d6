"""Inflight sampling clients (`save_weights_and_get_sampling_client(kind="inflight")`, the SDK's
`SamplingClientKind`) through the real SDK: every inflight client of a run samples the run's newest inflight
save, and an update reaches requests already generating, which go on (nothing aborted, nothing resent)."""

from __future__ import annotations

import time

import numpy as np
import tinker
from sdk_datums import sft_datum
from tinker import types
from txserver import TxServer

BASE = "tiny-qwen3"
PROMPT = [11, 12, 13, 14, 15]
TARGET = 777  # the token the run is taught to say


def prompt_logprobs(client: tinker.SamplingClient, tokens: list[int]) -> np.ndarray:
    return np.array(client.compute_logprobs(types.ModelInput.from_ints(tokens)).result()[1:], dtype=np.float32)


def trainer_logprobs(tc: tinker.TrainingClient, tokens: list[int]) -> np.ndarray:
    datum = sft_datum(tokens)
    return tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def teach_target(tc: tinker.TrainingClient, steps: int = 8) -> None:
    """A few steps on random prefixes followed by TARGET: the run then says TARGET after nearly anything."""
    rng = np.random.default_rng(3)
    data = []
    for _ in range(8):
        prefix = rng.integers(10, 1990, size=int(rng.integers(4, 24))).tolist()
        tokens = prefix + [TARGET] * 8
        weights = [0.0] * (len(prefix) - 1) + [1.0] * 8
        data.append(types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                                loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights}))
    for _ in range(steps):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()


def engine_health(server: TxServer) -> dict:
    ((engine, *_),) = [group["engines"] for group in server.engine_groups() if group["base_model"] == BASE]
    return engine["health"]


def test_inflight_clients_follow_the_runs_newest_inflight_save(service_client: tinker.ServiceClient) -> None:
    """Regression: an inflight client kept the weights it was created with (7.7 nats stale three steps on)."""
    tc = service_client.create_lora_training_client(BASE, rank=8, seed=0).result()
    tokens = np.random.default_rng(5).integers(10, 1990, size=24).tolist()
    first = tc.save_weights_and_get_sampling_client(kind="inflight").result()
    snapshot = tc.save_weights_and_get_sampling_client().result()
    initial = prompt_logprobs(first, tokens)
    teach_target(tc, steps=3)
    np.testing.assert_allclose(prompt_logprobs(first, tokens), initial, atol=1e-3)  # no inflight save since
    second = tc.save_weights_and_get_sampling_client(kind="inflight").result()
    trained = trainer_logprobs(tc, tokens)
    assert np.abs(trained - initial).max() > 0.5  # the steps moved the weights
    assert second.get_sampler_handle() != first.get_sampler_handle()  # each its own sampling session
    for client in (first, second):  # the old client too: it follows the run's inflight weights
        np.testing.assert_allclose(prompt_logprobs(client, tokens), trained, atol=1e-3)
    np.testing.assert_allclose(prompt_logprobs(snapshot, tokens), initial, atol=1e-3)  # a snapshot stays


def test_an_inflight_update_reaches_samples_already_in_flight(server: TxServer,
                                                              service_client: tinker.ServiceClient) -> None:
    """Async RL's rollout side: a rollout generating on an inflight client while the trainer publishes new
    weights picks them up mid-sequence; the request is neither aborted nor resent."""
    tc = service_client.create_lora_training_client(BASE, rank=8, seed=0).result()
    rollouts = tc.save_weights_and_get_sampling_client(kind="inflight").result()  # the initial weights
    teach_target(tc)
    greedy = types.SamplingParams(max_tokens=400, temperature=0.0, stop=[])
    prompt = types.ModelInput.from_ints(PROMPT)
    taught = tc.save_weights_and_get_sampling_client().result()  # a snapshot of the taught weights
    assert taught.sample(prompt, 1, types.SamplingParams(max_tokens=8, temperature=0.0)).result() \
        .sequences[0].tokens == [TARGET] * 8

    requests_before = engine_health(server)["stats"]["num_requests"]
    in_flight = rollouts.sample(prompt, 1, greedy)
    deadline = time.monotonic() + 60
    while engine_health(server)["num_running"] < 1:
        assert time.monotonic() < deadline, "the rollout never started"
        time.sleep(0.05)
    tc.save_weights_and_get_sampling_client(kind="inflight").result()  # publish: the rollout's weights change
    (seq,) = in_flight.result().sequences
    assert seq.stop_reason == "length" and len(seq.tokens) == greedy.max_tokens
    assert seq.tokens[0] != TARGET and seq.tokens[-16:] == [TARGET] * 16, "began on the old weights, ended new"
    switch = next(i for i in range(len(seq.tokens)) if seq.tokens[i:] == [TARGET] * (len(seq.tokens) - i))
    print(f"the update reached the rollout after {switch} of {len(seq.tokens)} tokens")
    assert engine_health(server)["stats"]["num_requests"] == requests_before + 1  # one request: none resent
