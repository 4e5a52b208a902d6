"""The server SIGKILLed during save_state, in a loop: after a restart every listed checkpoint loads,
and no `.tmp-`/`.old-` directory of an interrupted save is left on disk."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
import tinker
from tinker import types

from txserver import API_KEY, TxServer, abandon

DATA = [types.Datum(model_input=types.ModelInput.from_ints([3, 4, 5, 6]),
                    loss_fn_inputs={"target_tokens": [4, 5, 6, 7], "weights": [1.0] * 4})]


def leftovers(data_dir: Path) -> list[Path]:
    return [p for p in (data_dir / "checkpoints").glob("*/*/.*") if p.name.startswith((".tmp-", ".old-"))]


def kill_during_saves(server: TxServer, rng: random.Random) -> str:
    """Start saving (the same names again and again, overwriting), SIGKILL the server mid-way."""
    client = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    tc = client.create_lora_training_client("tiny-qwen3", rank=4).result()
    tc.save_state("ckpt-0").result()
    for i in range(40):
        tc.save_state(f"ckpt-{i % 3}", overwrite=True)  # not awaited: the kill lands among them
    time.sleep(rng.uniform(0.3, 1.0))
    os.killpg(server.proc.pid, signal.SIGKILL)
    server.proc.wait(10)
    abandon(client)
    return tc.model_id


@pytest.mark.slow
def test_checkpoints_load_after_a_kill_during_save_state(tmp_path: Path) -> None:
    rng, data_dir = random.Random(0), tmp_path / "data"
    server = TxServer(data_dir)
    model_ids, left = [], 0
    try:
        for _ in range(2):
            server.start()
            model_ids.append(kill_during_saves(server, rng))
            left += len(leftovers(data_dir))
        server.start()
        assert leftovers(data_dir) == [], f"{left} leftovers before the restart"
        with server.client() as client:
            tc = client.create_lora_training_client("tiny-qwen3", rank=4).result()
            for model_id in model_ids:
                for checkpoint in client.create_rest_client().list_checkpoints(model_id).result().checkpoints:
                    tc.load_state(checkpoint.tinker_path).result()
                    assert tc.forward(DATA, "cross_entropy").result().metrics["loss:sum"] > 0
    finally:
        server.stop()
