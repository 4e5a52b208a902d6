"""JWT auth as the SDK does it: the real `tinker auth login / whoami / logout` CLI against tx, the SDK
exchanging its key and renewing the token, expired and forged tokens refused, keys still working."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import tinker
from conftest import ALICE, BOB, OPERATOR, TTL_S
from prometheus_client.parser import text_string_to_metric_families
from sdk_datums import sft_datum
from tinker import types
from txserver import API_KEY, TxServer

from tx.api.auth import owner_of

CLI = r"""
import contextlib, io, json, sys
from tinker.cli.__main__ import main_cli
results = []
for args in json.loads(sys.argv[1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main_cli.main(args=args, prog_name="tinker", standalone_mode=False)
            rc = 0
        except SystemExit as exc:
            rc = exc.code or 0
        except Exception as exc:
            rc, _ = 1, out.write(f"{type(exc).__name__}: {exc}")
    results.append({"args": args, "rc": rc, "out": out.getvalue()})
print(json.dumps(results))
"""


def test_tinker_cli_logs_in_and_says_who_am_i(server: TxServer, tmp_path: Path) -> None:
    env = {**os.environ, "HOME": str(tmp_path), "TINKER_BASE_URL": server.url, "TINKER_TELEMETRY": "0"}
    env.pop("TINKER_API_KEY", None)  # whoami uses the key login stored
    commands = [["auth", "login"], ["-f", "json", "auth", "whoami"], ["auth", "logout"]]
    done = subprocess.run([sys.executable, "-c", CLI, json.dumps(commands)], env=env, input=f"{API_KEY}\n",
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    login, whoami, logout = json.loads(done.stdout.strip().splitlines()[-1])
    assert login["rc"] == 0 and "Stored API key 'tx key" in login["out"], login
    assert whoami["rc"] == 0, whoami
    owner = owner_of(API_KEY)
    assert json.loads(whoami["out"]) == {"user_urn": f"tx:key:{owner}", "org_urn": f"tml:organization:{owner}",
                                         "email": None}
    assert logout["rc"] == 0 and "still active" in logout["out"], logout  # tx's keys are the operator's


def requests_to(server: TxServer, route: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers={"X-API-Key": OPERATOR}).text
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "tx_http_requests_total" and s.labels["route"] == route and s.labels["status"] == "200")


def test_sdk_trains_on_renewed_tokens_and_stale_tokens_are_refused(keyed: TxServer) -> None:
    url = f"{keyed.url}/api/v1/training_runs"
    token = httpx.post(f"{keyed.url}/api/v1/auth/token", json={}, headers={"X-API-Key": ALICE}).json()["jwt"]
    assert httpx.get(url, headers={"X-API-Key": token}).status_code == 200
    forged = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    refused = httpx.get(url, headers={"X-API-Key": forged})
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    exchanges = requests_to(keyed, "/api/v1/auth/token")
    with keyed.client(api_key=ALICE) as service:
        tc = service.create_lora_training_client("tiny-qwen3", rank=4).result()
        tc.forward_backward([sft_datum(list(range(10, 30)))], "cross_entropy").result()
        time.sleep(TTL_S + 1)  # every token so far has expired
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        me = tinker.RestClient(base_url=keyed.url, api_key=ALICE).whoami().result()
        assert me.user_urn == f"tx:key:{owner_of(ALICE)}"
        runs = tinker.RestClient(base_url=keyed.url, api_key=BOB).list_training_runs().result()
        assert tc.model_id not in [r.training_run_id for r in runs.training_runs]
    assert requests_to(keyed, "/api/v1/auth/token") >= exchanges + 2  # the SDK exchanged again
    expired = httpx.get(url, headers={"X-API-Key": token})
    assert expired.status_code == 401 and "expired" in expired.json()["detail"]
    assert expired.headers["www-authenticate"] == 'Bearer error="invalid_token"'
    assert httpx.get(url, headers={"X-API-Key": ALICE}).status_code == 200  # keys keep working
    assert httpx.get(url, headers={"X-API-Key": "tml-mallory"}).status_code == 401


def test_key_facts(keyed: TxServer) -> None:
    me = httpx.get(f"{keyed.url}/api/v1/auth/apikey/me", headers={"X-API-Key": OPERATOR}).json()
    assert me["key_id"] == int(owner_of(OPERATOR)[:12], 16) and me["name"].endswith("(operator)")
    deleted = httpx.delete(f"{keyed.url}/api/v1/auth/apikey/me", headers={"X-API-Key": ALICE})
    assert deleted.status_code == 403 and "--api-key" in deleted.json()["detail"]
