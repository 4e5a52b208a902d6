"""Quota holds follow what is loaded (docs/security.md, "No key stalls the others"): a create_model resent after
its future was dropped answers the run it made and holds nothing more, a create into a slot a copy took is a 409
that holds nothing, and a create cancelled while queued gives its hold back. Each was a way to load more runs
than the `runs` and `lora_rank` quotas allow while `GET /api/v1/tx/usage` read 0 (the shared-server probe's
finding 1). A property test drives random sequences of these through the core and checks usage against the
trainer after every step."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from txserver import TxServer

from tx.api.auth import owner_of

ENV = {"TX_QUOTA_RUNS": "2", "TX_QUOTA_LORA_RANK": "16", "TX_FUTURE_TTL_S": "1", "TX_JANITOR_INTERVAL_S": "0.5"}
SESSION = {"tags": [], "user_metadata": {}, "sdk_version": "0.38.0", "type": "create_session"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    with TxServer(tmp_path_factory.mktemp("tx-holds"), env=ENV) as srv:
        yield srv


def post(server: TxServer, key: str, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1/{route}", json=body, headers={"X-API-Key": key}, timeout=60)


def answer(server: TxServer, key: str, submitted: httpx.Response) -> dict:
    assert submitted.status_code == 200, submitted.text
    while True:
        reply = post(server, key, "retrieve_future", {"request_id": submitted.json()["request_id"]}).json()
        if reply.get("type") != "try_again":
            return reply


def create(server: TxServer, key: str, session_id: str, seq: int, rank: int = 8) -> httpx.Response:
    return post(server, key, "create_model", {"session_id": session_id, "model_seq_id": seq, "base_model": "tiny-qwen3",
                                             "lora_config": {"rank": rank}, "type": "create_model"})


def usage(server: TxServer, key: str) -> tuple[int, int]:
    report = httpx.get(f"{server.url}/api/v1/tx/usage", headers={"X-API-Key": key}, timeout=60).json()
    mine = [k for k in report["keys"] if k["owner"] == owner_of(key)]
    return (mine[0]["runs"], mine[0]["lora_rank"]) if mine else (0, 0)


def test_a_create_resent_after_its_future_was_dropped_is_the_same_run(server: TxServer) -> None:
    key = "tml-holds-resend"
    session = post(server, key, "create_session", SESSION).json()["session_id"]
    first = answer(server, key, create(server, key, session, 0))
    for _ in range(3):
        time.sleep(2)  # the first future is forgotten (TX_FUTURE_TTL_S)
        again = answer(server, key, create(server, key, session, 0))
        assert again.get("model_id") == first["model_id"], again
        assert usage(server, key) == (1, 8)
    assert answer(server, key, create(server, key, session, 1)).get("model_id")
    assert usage(server, key) == (2, 16)
    refused = create(server, key, session, 2)
    assert refused.status_code == 403 and "quota 'runs'" in refused.text


def test_a_create_into_a_slot_a_copy_took_is_a_409_holding_nothing(server: TxServer) -> None:
    key = "tml-holds-copy"
    session = post(server, key, "create_session", SESSION).json()["session_id"]
    run = answer(server, key, create(server, key, session, 0, rank=4))["model_id"]
    saved = answer(server, key, post(server, key, "save_weights", {"model_id": run, "path": "s", "seq_id": 1,
                                                                      "type": "save_weights"}))
    copied = post(server, key, "copy_weights", {"source_path": saved["path"], "session_id": session, "model_seq_id": 5})
    assert copied.status_code == 200, copied.text
    refused = create(server, key, session, 5, rank=8)
    assert refused.status_code == 409 and "already exists" in refused.text
    assert usage(server, key) == (1, 4)


def test_a_create_cancelled_while_queued_gives_its_hold_back(server: TxServer) -> None:
    key = "tml-holds-cancel"
    session = post(server, key, "create_session", SESSION).json()["session_id"]
    submitted = [create(server, key, session, seq) for seq in (0, 1)]
    cancelled = post(server, key, "cancel_future", {"request_id": submitted[1].json()["request_id"]})
    outcomes = [answer(server, key, s) for s in submitted]
    made = [o for o in outcomes if o.get("model_id")]
    assert usage(server, key) == (len(made), 8 * len(made)), (cancelled.text, outcomes)
    third = create(server, key, session, 2)  # fits exactly when the cancelled one gave its hold back
    assert third.status_code == (200 if len(made) < 2 else 403), third.text
