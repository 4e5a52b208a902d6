"""The vLLM engine checked against the trainer before its base model is sampled (tx/inference/manager/
selfcheck.py): a vLLM that agrees serves; one that reports wrong prompt logprobs (a fault injected in the vLLM
engine for tests only, `TX_TEST_FAULT_VLLM_PROMPT_LOGPROBS`) is refused with a 400 naming the check, at once."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest
import tinker
from live_engine import vllm_missing
from tinker import types
from txserver import TxServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
BASE = "tiny-qwen3"
PROMPT = types.ModelInput.from_ints([1, 2, 3])
GREEDY = types.SamplingParams(max_tokens=2, temperature=0.0)


def serve(tmp_path_factory: pytest.TempPathFactory, name: str, env: dict[str, str]) -> Iterator[TxServer]:
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    with TxServer(tmp_path_factory.mktemp(name), args=["--engine", "vllm"], env=env) as srv:
        yield srv


@pytest.fixture
def agreeing(vllm_server: TxServer) -> TxServer:
    """The session's `tx serve --engine vllm` (tests/vllm_engine/conftest.py): in a run of the directory,
    test_serve_vllm.py's, which has sampled its base model many times by then (and had its engine killed and
    restarted): the check still ran once."""
    return vllm_server


@pytest.fixture
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    yield from serve(tmp_path_factory, "tx-vllm-fault", {"TX_TEST_FAULT_VLLM_PROMPT_LOGPROBS": "0.01"})


def self_check_line(server: TxServer) -> str:
    lines = [line for line in server.log().splitlines() if "engine self-check of" in line]
    assert len(lines) == 1, lines  # once per base model, not once per sample
    return lines[0]


def test_a_vllm_that_agrees_with_the_trainer_passes_and_serves(agreeing: TxServer) -> None:
    with agreeing.client() as client:
        sampler = client.create_sampling_client(base_model=BASE)
        first = sampler.sample(PROMPT, 1, GREEDY).result()
        second = sampler.sample(PROMPT, 1, GREEDY).result()
    assert first.sequences[0].tokens == second.sequences[0].tokens
    line = self_check_line(agreeing)
    assert "served" in line and "REFUSED" not in line, line
    seconds = float(re.search(r"\) in ([0-9.]+) s:", line).group(1))
    print(f"\nself-check: {line}")  # its cost at load: shown with -s
    assert seconds < 30, line


def test_a_vllm_whose_logprobs_are_off_is_refused_naming_the_check(faulty: TxServer) -> None:
    """0.01 nats off on every prompt logprob: 100 times the float32 bound, and no sample of the base model
    is served; every request fails with a 400 at once (none waits)."""
    with faulty.client() as client:
        sampler = client.create_sampling_client(base_model=BASE)
        for _ in range(2):
            start = time.monotonic()
            with pytest.raises((tinker.BadRequestError, tinker.RequestFailedError), match=r"engine self-check 'alone' and 'batched'"):
                sampler.sample(PROMPT, 1, GREEDY).result()
            assert time.monotonic() - start < 120
    assert "REFUSED" in self_check_line(faulty)
