"""Each training run records the base weights it was created on (issue 43: the hub revision, None for a local
directory, and the weights' fingerprint), and a checkpoint trained on other weights than those served now under
its base model's name is refused when loaded, naming both; a run recorded before (no fingerprint) loads as
before. Runs are named and tagged (issue 41): from the SDK's user_metadata at create, and by the console's PATCH,
its owner only, within bounds. Real SDK against a real server (`keyed`: alice, bob and an operator)."""

from __future__ import annotations

import sqlite3

import httpx
import pytest
import tinker
from conftest import ALICE, BOB, OPERATOR
from txserver import TxServer

from tx.models.fingerprint import model_fingerprint


def rest_run(server: TxServer, key: str, run_id: str) -> dict:
    answer = httpx.get(f"{server.url}/api/v1/training_runs/{run_id}", headers={"X-API-Key": key}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def label(server: TxServer, key: str, run_id: str, body: dict) -> httpx.Response:
    return httpx.patch(f"{server.url}/api/v1/console/runs/{run_id}", headers={"X-API-Key": key}, json=body,
                       timeout=30)


def set_recorded_fingerprint(server: TxServer, run_id: str, fingerprint: str | None) -> None:
    """Stands in for a run created when other weights were served under the same name."""
    with sqlite3.connect(server.data_dir / "tx.db") as db:
        db.execute("UPDATE training_runs SET base_fingerprint = ? WHERE run_id = ?", (fingerprint, run_id))


def test_a_run_records_its_base_weights_and_a_checkpoint_of_other_weights_is_refused(keyed: TxServer) -> None:
    with keyed.client(ALICE) as alice:
        tc = alice.create_lora_training_client("tiny-qwen3", rank=4).result()
        state = tc.save_state("provenance").result().path
        run = rest_run(keyed, ALICE, tc.model_id)
        served = model_fingerprint(keyed.data_dir / "models" / "tiny-qwen3")
        assert (run["base_fingerprint"], run["base_revision"]) == (served, None)  # a local directory: no revision
        assert alice.create_training_client_from_state(state).result().model_id  # the same weights: loads

        set_recorded_fingerprint(keyed, tc.model_id, "sha256:0000other")
        with pytest.raises(tinker.BadRequestError, match=f"sha256:0000other.*{served}"):
            alice.create_training_client_from_state(state).result()
        with pytest.raises(tinker.BadRequestError, match=f"sha256:0000other.*{served}"):
            tc.load_state(state).result()

        set_recorded_fingerprint(keyed, tc.model_id, None)  # a run recorded before migration 0009
        assert alice.create_training_client_from_state_with_optimizer(state).result().model_id


def test_a_run_is_named_and_tagged_from_user_metadata_and_by_its_owner_only(keyed: TxServer) -> None:
    with keyed.client(ALICE) as alice:
        tc = alice.create_lora_training_client("tiny-qwen3", rank=4,
                                               user_metadata={"name": "sft lr 1e-4", "tags": "sft, tiny"}).result()
        run_id = tc.model_id
        run = rest_run(keyed, ALICE, run_id)
        assert (run["name"], run["tags"], run["user_metadata"]["name"]) == ("sft lr 1e-4", ["sft", "tiny"],
                                                                           "sft lr 1e-4")
        sdk_run = alice.create_rest_client().get_training_run(run_id).result()  # the SDK ignores tx's fields
        assert sdk_run.training_run_id == run_id

        answer = label(keyed, ALICE, run_id, {"name": "renamed"})
        assert answer.status_code == 200 and answer.json() == {"name": "renamed", "tags": ["sft", "tiny"]}
        assert label(keyed, ALICE, run_id, {"tags": []}).json() == {"name": "renamed", "tags": []}
        for body, words in [({"name": "x" * 121}, "at most 120 characters"), ({"tags": ["t" * 41]}, "at most 40"),
                            ({"tags": [f"t{i}" for i in range(17)]}, "at most 16 tags")]:
            refused = label(keyed, ALICE, run_id, body)
            assert refused.status_code == 400 and words in refused.json()["detail"], refused.text
        assert label(keyed, ALICE, run_id, {"tags": "not a list"}).status_code == 422
        for other in (BOB, OPERATOR):  # the owner only: another key, an operator's too, learns nothing
            assert label(keyed, other, run_id, {"name": "mine now"}).status_code == 404
        assert rest_run(keyed, ALICE, run_id)["name"] == "renamed"

    with keyed.client(ALICE) as alice, pytest.raises(tinker.BadRequestError, match="at most 120 characters"):
        alice.create_lora_training_client("tiny-qwen3", rank=4, user_metadata={"name": "n" * 121}).result()
