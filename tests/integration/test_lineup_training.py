"""Hosted Tinker's newer families (tests/families.py LINEUP) train through the SDK against one real `tx serve`,
as a user's script would: filed under the hub names users pass (`tx models make-tiny NAME` picks the family),
a LoRA run is created, a datum's logprobs are the same in a batch as alone (1e-5), the loss falls on a repeated
batch, and the run saves its state. Sampling them is the engines' (tests/integration/test_families.py covers
the families the engines serve).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tinker
from cookbook import offline_env
from families import LINEUP
from sdk_datums import sft_datum
from tinker import types
from txserver import TxServer

from tx.models import preset_for_name, write_to_hf_cache

HUB_NAMES = (  # one name per LINEUP family, as users pass them
    "allenai/Olmo-3-7B-Instruct",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "deepseek-ai/DeepSeek-V4-Flash",
    "zai-org/GLM-5",
    "Qwen/Qwen3-VL-30B-A3B-Instruct",
    "thinkingmachines/Inkling",
)
STEPS = 6
VOCAB = 2000  # regular tokens of the tiny tokenizer


def test_the_names_cover_the_lineup() -> None:
    assert sorted(preset_for_name(name) for name in HUB_NAMES) == sorted(LINEUP)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    hf_home = tmp_path_factory.mktemp("lineup") / "hf"
    for name in HUB_NAMES:
        write_to_hf_cache(name, hf_home)
    args = [a for name in HUB_NAMES for a in ("--base-model", name)]
    with TxServer(tmp_path_factory.mktemp("tx-lineup"), args=args, env=offline_env(hf_home)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: TxServer) -> Iterator[tinker.ServiceClient]:
    with server.client() as c:
        yield c


def logprobs(result) -> list[np.ndarray]:
    return [out["logprobs"].to_numpy() for out in result.loss_fn_outputs]


@pytest.mark.parametrize("name", HUB_NAMES)
def test_family_trains_through_the_sdk(client: tinker.ServiceClient, name: str) -> None:
    rng = np.random.default_rng(0)
    data = [sft_datum(rng.integers(10, VOCAB, size=n).tolist()) for n in (17, 9, 24, 12)]
    tc = client.create_lora_training_client(name, rank=8, seed=0).result()

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
