"""A session that stops heartbeating (a crashed client) is finished and its models are freed."""

from __future__ import annotations

import time

import httpx

from txserver import API_KEY, TxServer

HEADERS = {"X-API-Key": API_KEY}


def test_silent_session_is_finished_and_its_model_freed(tmp_path) -> None:
    with TxServer(tmp_path / "data", env={"TX_SESSION_TIMEOUT_S": "2", "TX_JANITOR_INTERVAL_S": "0.5"}) as server:
        with httpx.Client(base_url=f"{server.url}/api/v1", headers=HEADERS, timeout=60) as http:
            session = http.post("/create_session", json={"tags": [], "user_metadata": {}}).json()["session_id"]
            future = http.post("/create_model", json={
                "session_id": session, "model_seq_id": 0, "base_model": "tiny-qwen3",
                "lora_config": {"rank": 4}}).json()
            created = http.post("/retrieve_future", json={"request_id": future["request_id"]}).json()
            assert created["model_id"] == f"{session}:train:0"
            alive = http.post("/session_heartbeat", json={"session_id": session, "type": "session_heartbeat"})
            assert alive.status_code == 200

            time.sleep(4)  # no heartbeats: the janitor finishes the session
            gone = http.post("/session_heartbeat", json={"session_id": session, "type": "session_heartbeat"})
            assert gone.status_code == 410
            step = http.post("/optim_step", json={"model_id": created["model_id"], "seq_id": 1,
                                                  "adam_params": {"learning_rate": 1e-3}})
            assert step.status_code == 400 and "not loaded" in step.json()["detail"]
        assert "sent no heartbeat" in server.log()
