"""A keyless local server resists DNS rebinding (docs/security.md#local-servers-and-dns-rebinding): a page
whose own name was made to resolve to 127.0.0.1 sends that name in `Host`, and gets a 421 on every route
that reads or acts; the SDK and the console keep working through the server's own names."""

from __future__ import annotations

import httpx
import pytest
import tinker
from sdk_datums import sft_datum
from tinker import types
from txserver import API_KEY, TxServer

ROUTES = ["/api/v1/training_runs", "/api/v1/console/me", "/api/v1/tx/usage", "/api/v1/tx/engines", "/metrics",
          "/console"]


@pytest.mark.parametrize("route", ROUTES)
def test_a_rebound_page_gets_a_421_and_the_servers_own_names_are_answered(server: TxServer, route: str) -> None:
    key = {"X-API-Key": "tml-local"}
    rebound = httpx.get(f"{server.url}{route}", headers={**key, "Host": "rebind.evil.example"}, timeout=60)
    assert rebound.status_code == 421, rebound.text
    assert "--allowed-host" in rebound.json()["detail"]
    for name in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", f"[::1]:{server.port}"):
        answer = httpx.get(f"{server.url}{route}", headers={**key, "Host": name}, timeout=60, follow_redirects=True)
        assert answer.status_code == 200, (name, answer.text[:300])


def test_the_sdk_trains_through_localhost(server: TxServer) -> None:
    service = tinker.ServiceClient(base_url=f"http://localhost:{server.port}", api_key=API_KEY)
    try:
        tc = service.create_lora_training_client("tiny-qwen3", rank=4, seed=0).result()
        out = tc.forward_backward([sft_datum([5, 6, 7, 8, 9])], "cross_entropy").result()
        assert out.loss_fn_outputs
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    finally:
        service.close("success").result()
