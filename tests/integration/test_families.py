"""Every supported family through the SDK against one real `tx serve`: create a LoRA run, the loss falls, the
run saves, and it samples 4 completions per prompt on the embedded engine whose logprobs are the trainer's
(1e-3, float32); a datum's logprobs are the same in a batch as alone (1e-5).

The models are tiny random ones filed under the hub names users pass (`tx models make-tiny NAME` picks the
family from the name); the text-only Qwen3.5s, which no hub name maps to, are served from directories.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
from cookbook import offline_env
from families import FAMILIES
from sdk_datums import sft_datum
from tinker import types
from txserver import TxServer

from tx.models import preset_for_name, write_tiny_model, write_to_hf_cache
from tx.models.tiny_families import installed

HUB_NAMES = {  # hub name -> the family its tiny model must be
    "Qwen/Qwen3-8B": "tiny",
    "meta-llama/Llama-3.2-1B": "llama",
    "google/gemma-3-1b-it": "gemma3",
    "Qwen/Qwen3-30B-A3B": "qwen3_moe",
    "deepseek-ai/DeepSeek-V3.1": "deepseek_v3",
    "openai/gpt-oss-20b": "gpt_oss",
    "Qwen/Qwen3.5-4B": "qwen3_5_vl",
    "Qwen/Qwen3.6-35B-A3B": "qwen3_5_moe_vl",
    "allenai/Olmo-3-7B-Instruct": "olmo3",  # hosted Tinker's newer families (tests/families.py LINEUP)
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "nemotron_h",
    "deepseek-ai/DeepSeek-V4-Flash": "deepseek_v4",
    "zai-org/GLM-5": "glm_moe_dsa",
    "Qwen/Qwen3-VL-30B-A3B-Instruct": "qwen3_vl_moe",
    "thinkingmachines/Inkling": "inkling",
    "thinkingmachines/Inkling-2-Small-MXFP8": "inkling2",
    "mistralai/Mistral-Large-4-1T-A52B": "mistral_large4",
}
HUB_NAMES = {name: family for name, family in HUB_NAMES.items() if installed(family)}  # as tests/families.py
DIRECTORIES = ("qwen3_5", "qwen3_5_moe")
pytestmark = pytest.mark.slow  # ~7 min on this project's loaded 2-core machine (2.5 min of CPU) before the lineup

STEPS = 6
VOCAB = 2000  # regular tokens of the tiny tokenizer


def test_the_names_and_directories_cover_every_family() -> None:
    assert all(preset_for_name(name) == family for name, family in HUB_NAMES.items())
    assert sorted([*HUB_NAMES.values(), *DIRECTORIES]) == sorted(FAMILIES)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The HF home holding the hub-named models, and every base model name to serve."""
    root = tmp_path_factory.mktemp("families")
    for name in HUB_NAMES:
        write_to_hf_cache(name, root / "hf")  # the name picks the preset
    dirs = [str(write_tiny_model(root / preset, preset=preset)) for preset in DIRECTORIES]
    return root / "hf", [*HUB_NAMES, *dirs]


@pytest.fixture(scope="module")
def server(served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    hf_home, names = served
    args = [a for name in names for a in ("--base-model", name)] + ["--no-engine-colocate"]
    args += ["--quota-runs", str(2 * len(names))]  # a run per family, more families than the default quota (16)
    with TxServer(tmp_path_factory.mktemp("tx-families"), args=args, env=offline_env(hf_home)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: TxServer) -> Iterator[tinker.ServiceClient]:
    with server.client() as c:
        yield c


def logprobs(result) -> list[np.ndarray]:
    return [out["logprobs"].to_numpy() for out in result.loss_fn_outputs]


def base_model(name: str, served) -> str:
    return next(served_name for served_name in served[1] if served_name.endswith(name))


@pytest.mark.parametrize("name", [*HUB_NAMES, *DIRECTORIES])
def test_family_trains_saves_and_samples(client: tinker.ServiceClient, served, name: str) -> None:
    rng = np.random.default_rng(0)
    data = [sft_datum(rng.integers(10, VOCAB, size=n).tolist()) for n in (17, 9, 24, 12)]
    tc = client.create_lora_training_client(base_model(name, served), rank=8, seed=0).result()

    together = logprobs(tc.forward(data, "cross_entropy").result())
    for i in (0, 1):
        alone = logprobs(tc.forward([data[i]], "cross_entropy").result())[0]
        np.testing.assert_allclose(together[i], alone, rtol=1e-5, atol=1e-5)

    losses = []
    for _ in range(STEPS):
        losses.append(tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=2e-2)).result()
    assert losses[-1] < 0.7 * losses[0], losses

    tc.save_state("after").result()
    sampler = tc.save_weights_and_get_sampling_client()
    prompt = data[0].model_input.to_ints()[:6]
    out = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=4,
                         sampling_params=types.SamplingParams(max_tokens=8, temperature=1.0)).result()
    assert len(out.sequences) == 4
    for seq in out.sequences:
        trainer = logprobs(tc.forward([sft_datum(prompt + list(seq.tokens))], "cross_entropy").result())[0]
        np.testing.assert_allclose(seq.logprobs, trainer[len(prompt) - 1:], atol=1e-3)
