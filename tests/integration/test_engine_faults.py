"""No request left waiting, end to end: a real `tx serve` and the real `tinker` SDK over a model whose prefill fails
for long prompts. The sample that meets the failure raises promptly, naming the cause; the server and the engine
stay up and serve the next sample (docs/engines.md#the-embedded-engine).

No test hook in shipped code: the fault is the model's own. Its config asks for LongRoPE with a `long_factor` one
entry per rotary pair too short. transformers only warns about that when it loads the model (which then serves
short prompts as usual); a prompt longer than `original_max_position_embeddings` makes its rotary embedding build
the long frequencies, and that raises ("The size of tensor a (3) must match the size of tensor b (16)"). It fails
the same way in the engine's prefill of any prompt that long, so the fault lands where the known bug was: the
request being admitted.
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
"""`original_max_position_embeddings`: longer sequences take the broken long factor (the engine's load-time
self-check runs shorter ones)."""
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
def broken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TxServer, str]]:
    root = tmp_path_factory.mktemp("engine-faults")
    model_dir = write_model_failing_long_prompts(root / "model")
    args = ["--base-model", str(model_dir), "--no-engine-colocate"]
    with TxServer(root / "data", args=args, env={"OMP_NUM_THREADS": "1"}) as server:
        yield server, str(model_dir)


@pytest.fixture(scope="module")
def sampler(broken) -> Iterator[tinker.SamplingClient]:
    server, model = broken
    with server.client() as client:
        yield client.create_sampling_client(base_model=model).result()


def sample(sampler: tinker.SamplingClient, prompt_len: int, timeout_s: float = 120) -> types.SampleResponse:
    prompt = types.ModelInput.from_ints([(7 * i) % 500 + 10 for i in range(prompt_len)])
    params = types.SamplingParams(max_tokens=4, temperature=0.0)
    return sampler.sample(prompt, 1, params).result(timeout=timeout_s)


def test_a_sample_whose_prefill_fails_raises_promptly_naming_the_cause_and_the_next_one_is_served(broken, sampler):
    server, _ = broken
    assert len(sample(sampler, 8).sequences[0].tokens) == 4  # the engine started, and serves short prompts
    start = time.monotonic()
    with pytest.raises(tinker.RequestFailedError) as failure:
        sample(sampler, SHORT_LIMIT + 16, timeout_s=FAILS_FAST_S * 4)
    assert time.monotonic() - start < FAILS_FAST_S, "the failed sample was answered only at its timeout"
    message = str(failure.value)
    assert "RuntimeError" in message and "must match the size of tensor" in message, message
    assert len(sample(sampler, 8).sequences[0].tokens) == 4  # the server and the engine stay up
    (group,) = server.engine_groups()
    (engine,) = group["engines"]
    assert engine["alive"] and engine["restarts"] == 0, engine
    assert engine["health"]["num_running"] == engine["health"]["num_waiting"] == 0, engine["health"]
