"""The audit log through the SDK's AdminClient: each tenant reads what they did and what was done to what they
own, an operator reads everything; the billing routes are a clear 404."""

from __future__ import annotations

from datetime import date

import pytest
import tinker
from conftest import ALICE, BOB, OPERATOR
from sdk_datums import sft_datum
from txserver import TxServer

from tx.api.auth import owner_of


def log_of(server: TxServer, key: str, **query) -> list[tinker.types.AuditLogEntry]:
    return tinker.AdminClient(base_url=server.url, api_key=key).get_audit_log(**query).result().entries


def test_owners_read_their_entries_and_operators_read_all(keyed: TxServer) -> None:
    with keyed.client(api_key=ALICE) as alice, keyed.client(api_key=BOB) as bob:
        tc = alice.create_lora_training_client("tiny-qwen3", rank=4).result()
        tc.forward_backward([sft_datum(list(range(10, 30)))], "cross_entropy").result()
        sampler_path = tc.save_weights_for_sampler("shared").result().path
        rest = tinker.RestClient(base_url=keyed.url, api_key=ALICE)
        rest.publish_checkpoint_from_tinker_path(sampler_path).result()
        bob.create_sampling_client(model_path=sampler_path)
        bobs_copy = tinker.RestClient(base_url=keyed.url, api_key=BOB).copy_weights(sampler_path, "mine").result()
        bobs_run = bob.create_lora_training_client("tiny-qwen3", rank=4).result().model_id

    alices = log_of(keyed, ALICE)
    this_run = [e for e in alices if e.event_details.get("training_run_id") == tc.model_id]  # the server is shared
    events = [(e.event, e.event_details.get("actor")) for e in this_run]
    alice_urn, bob_urn = f"tx:key:{owner_of(ALICE)}", f"tx:key:{owner_of(BOB)}"
    bob_seen = events[3][1]  # Bob as Alice sees him: a pseudonym, not his owner id (issue 38 item 8c)
    assert bob_seen.startswith("tx:key:other-") and owner_of(BOB) not in str(this_run)
    assert events == [("run_create", alice_urn), ("checkpoint_save", alice_urn), ("checkpoint_publish", alice_urn),
                      ("checkpoint_read", bob_seen), ("checkpoint_copy", bob_seen)]
    read = next(e for e in alices if e.event == "checkpoint_read")
    assert (read.tinker_path, read.purpose, read.model_id) == (sampler_path, "sample", tc.model_id)
    assert read.event_details["owner"] == alice_urn
    copied = next(e for e in alices if e.event == "checkpoint_copy")
    bobs_session = bobs_copy.removeprefix("tinker://").split(":")[0]
    assert "copy" not in copied.event_details and bobs_session not in str(alices)
    assert all(bobs_run not in str(e.event_details) for e in alices)  # nothing of Bob's own

    bobs = log_of(keyed, BOB, event_type="checkpoints")
    assert [e.event for e in bobs if e.model_id == tc.model_id] == ["checkpoint_read", "checkpoint_copy"]
    assert next(e for e in bobs if e.event == "checkpoint_copy").event_details["copy"] == bobs_copy
    assert {e.event_details["actor"] for e in bobs if e.model_id == tc.model_id} == {bob_urn}
    assert all(e.event.startswith("checkpoint_") for e in bobs)
    assert bob_urn in str(log_of(keyed, OPERATOR, event_type="checkpoints"))  # an operator sees who
    everything = log_of(keyed, OPERATOR, event_type="runs")
    assert {e.event_details["training_run_id"] for e in everything} >= {tc.model_id, bobs_run}
    assert log_of(keyed, OPERATOR, day=date(2001, 1, 1)) == []
    assert log_of(keyed, ALICE, event_type="projects") == []  # tx has no projects to grant


def test_billing_is_a_clear_404(keyed: TxServer) -> None:
    admin = tinker.AdminClient(base_url=keyed.url, api_key=ALICE)
    with pytest.raises(tinker.NotFoundError, match="does not bill"):
        admin.get_billing_usage("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z").result()
    with pytest.raises(tinker.NotFoundError, match="does not bill"):
        admin.get_current_checkpoint_storage_usage().result()
