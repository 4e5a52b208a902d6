"""Sampling at its limits: a full queue answers 429 and the SDK's retry succeeds; user mistakes are 400s."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import tinker
from tinker import types

from txserver import API_KEY, TxServer

BASE = "tiny-qwen3"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """At most one sample in flight: a second one at the same moment gets a 429."""
    srv = TxServer(tmp_path_factory.mktemp("tx-limits"),
                   args=["--no-engine-colocate"], env={"TX_SAMPLING_MAX_QUEUE": "1"}).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def sampler(server: TxServer) -> Iterator[tinker.SamplingClient]:
    client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    yield client.create_sampling_client(base_model=BASE)
    client.close("success")


def test_the_sdk_retry_after_a_429_succeeds(sampler: tinker.SamplingClient) -> None:
    params = types.SamplingParams(max_tokens=4, temperature=1.0)
    futures = [sampler.sample(types.ModelInput.from_ints([5, 6, 7]), 1, params) for _ in range(3)]
    for future in futures:
        assert len(future.result(timeout=120).sequences[0].tokens) == 4
