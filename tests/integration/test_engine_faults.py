"""No request left waiting, end to end: a real `tx serve` and the real `tinker` SDK over a model whose prefill fails.
The sample that meets the failure raises promptly, naming the cause; the server and the engine stay up, and the
server serves a healthy model's sample beside it (docs/engines.md#a-step-that-fails).

No test hook in shipped code: the fault is the model's own. Its config asks for LongRoPE with a `long_factor` one
entry per rotary pair too short. transformers only warns about that when it loads the model; its rotary embedding
then raises ("The size of tensor a (3) must match the size of tensor b (16)") when it builds the long frequencies:
on transformers 5.19 for a prompt longer than `original_max_position_embeddings`, on 5.23 for any prompt. The
engine's load-time self-check meets it first and serves the model unchecked (it says so in its log); the fault
then lands where the known bug was: the request being admitted.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tinker
from tinker import types
from txserver import TxServer

SHORT_LIMIT = 64
"""`original_max_position_embeddings`: longer prompts take the broken long factor on every transformers."""
FAILS_FAST_S = 30.0
"""A sample the engine failed is answered within this (the model's prefill takes milliseconds); the SDK's own
timeout (`result(timeout=...)`) is longer, so a request left waiting fails the test as a timeout instead."""


def write_model_failing_long_prompts(directory: Path) -> Path:
    """The tiny Qwen3, its rope made LongRoPE with a `long_factor` of the wrong length (see the module's docstring)."""
    from tx.models.tiny import write_tiny_text_model

    write_tiny_text_model(directory, preset="tiny", seed=0)
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    pairs = config["head_dim"] // 2
    config["rope_parameters"] = {
        **(config.get("rope_parameters") or {}), "rope_type": "longrope", "factor": 2.0,
        "original_max_position_embeddings": SHORT_LIMIT, "short_factor": [1.0] * pairs, "long_factor": [1.0] * 3,
    }
    config_path.write_text(json.dumps(config))
    return directory


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TxServer, str, str]]:
    from tx.models.tiny import write_tiny_text_model

    root = tmp_path_factory.mktemp("engine-faults")
    model_dir = write_model_failing_long_prompts(root / "model")
    healthy = write_tiny_text_model(root / "healthy", preset="tiny", seed=1)
    args = ["--base-model", str(model_dir), "--base-model", str(healthy), "--no-engine-colocate"]
    with TxServer(root / "data", args=args, env={"OMP_NUM_THREADS": "1"}) as server:
        yield server, str(model_dir), str(healthy)


def sample(sampler: tinker.SamplingClient, prompt_len: int, timeout_s: float = 120) -> types.SampleResponse:
    prompt = types.ModelInput.from_ints([(7 * i) % 500 + 10 for i in range(prompt_len)])
    params = types.SamplingParams(max_tokens=4, temperature=0.0)
    return sampler.sample(prompt, 1, params).result(timeout=timeout_s)


def test_a_sample_whose_prefill_fails_raises_promptly_naming_the_cause_and_the_server_serves_on(broken):
    server, model, healthy = broken
    with server.client() as client:
        sampler = client.create_sampling_client(base_model=model).result()
        start = time.monotonic()
        with pytest.raises(tinker.RequestFailedError) as failure:
            sample(sampler, SHORT_LIMIT + 16, timeout_s=FAILS_FAST_S * 4)
        assert time.monotonic() - start < FAILS_FAST_S, "the failed sample was answered only at its timeout"
        message = str(failure.value)
        assert "RuntimeError" in message and "must match the size of tensor" in message, message
        other = client.create_sampling_client(base_model=healthy).result()
        assert len(sample(other, 8).sequences[0].tokens) == 4  # the server stays up
    group = next(g for g in server.engine_groups() if g["engines"][0]["health"]["model"] == model)
    (engine,) = group["engines"]
    assert engine["alive"] and engine["restarts"] == 0, engine
    assert engine["health"]["num_running"] == engine["health"]["num_waiting"] == 0, engine["health"]
