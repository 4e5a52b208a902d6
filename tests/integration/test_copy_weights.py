"""copy_weights through the SDK: into a project (ServiceClient(project_id=...)) or a session, sharing the source's
bytes, owned by the caller with its own TTL, from another key's published checkpoint (or with their token as the
weights access token), and whole after the source is deleted."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from conftest import Trained
from sdk_datums import sft_datum
from txserver import API_KEY, TxServer

OTHER = "tml-other-tenant"


def files_of(server: TxServer, path: str) -> dict[str, Path]:
    run, kind, name = path.removeprefix("tinker://").split("/")
    root = server.data_dir / "checkpoints" / run / kind / name
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}


def logprobs_from(service: tinker.ServiceClient, path: str, tokens: list[int]) -> np.ndarray:
    tc = service.create_training_client_from_state(path).result()
    return tc.forward([sft_datum(tokens)], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def test_a_copy_shares_bytes_outlives_its_source_and_is_the_callers(server: TxServer, trained: Trained) -> None:
    source = trained.tc.save_state(f"to-copy-{uuid.uuid4().hex[:6]}").result().path
    project = f"archive-{uuid.uuid4().hex[:6]}"
    with server.client(project_id=project) as archive:
        copy = archive.copy_weights(source, ttl_seconds=7200).result()
        run, kind, name = copy.removeprefix("tinker://").split("/")
        assert run != trained.tc.model_id and f"{kind}/{name}" == source.split("/", 3)[3]
        for rel, original in files_of(server, source).items():  # the same inodes: no byte copied
            assert files_of(server, copy)[rel].stat().st_ino == original.stat().st_ino
        listed = trained.rest.list_checkpoints(run).result().checkpoints
        assert [(c.tinker_path, c.public, c.expires_at is not None) for c in listed] == [(copy, False, True)]
        assert trained.rest.get_training_run(run).result().base_model == "tiny-qwen3"
        found = trained.rest.search_sessions(tinker.types.SessionSearchRequest(project_ids=[project])).result().sessions
        assert len(found) == 1 and run.startswith(found[0].session_id)
        trained.rest.delete_checkpoint_from_tinker_path(source).result()
        with pytest.raises(tinker.NotFoundError):
            archive.create_training_client_from_state(source).result()
        np.testing.assert_allclose(logprobs_from(archive, copy, trained.tokens), trained.trainer_logprobs(), atol=1e-6)
        with pytest.raises(tinker.BadRequestError, match="between 3600"):
            archive.copy_weights(copy, ttl_seconds=60).result()


def test_copying_another_keys_checkpoint_needs_it_published_or_their_token(server: TxServer, trained: Trained) -> None:
    source = trained.tc.save_weights_for_sampler(f"shared-{uuid.uuid4().hex[:6]}").result().path
    theirs = tinker.RestClient(base_url=server.url, api_key=OTHER)
    with pytest.raises(tinker.NotFoundError):
        theirs.copy_weights(source, "proj-b").result()
    token = httpx.post(f"{server.url}/api/v1/auth/token", json={}, headers={"X-API-Key": API_KEY}).json()["jwt"]
    with_token = theirs.copy_weights(source, "proj-b", weights_access_token=token).result()
    trained.rest.publish_checkpoint_from_tinker_path(source).result()
    published = theirs.copy_weights(source, "proj-b").result()
    trained.rest.unpublish_checkpoint_from_tinker_path(source).result()
    for copy in (with_token, published):
        assert copy.split("/")[3:] == ["sampler_weights", source.rsplit("/", 1)[1]]
        [listed] = theirs.list_checkpoints(copy.split("/")[2]).result().checkpoints  # the copy is theirs...
        assert listed.tinker_path == copy and listed.expires_at is None
        with pytest.raises(tinker.NotFoundError):  # ...and not the source owner's
            trained.rest.list_checkpoints(copy.split("/")[2]).result()
    with server.client(api_key=OTHER) as service:
        sampler = service.create_sampling_client(model_path=published).result()
        assert sampler.compute_logprobs(tinker.ModelInput.from_ints(trained.tokens)).result()[1] is not None


def test_copy_into_a_session_is_idempotent_and_never_trained(server: TxServer, trained: Trained) -> None:
    source = trained.state_path
    session = trained.service.holder._session_id
    url, key = f"{server.url}/api/v1/copy_weights", str(uuid.uuid4())
    body = {"source_path": source, "session_id": session, "model_seq_id": 77}
    headers = {"X-API-Key": API_KEY, "X-Idempotency-Key": key}
    first, again = (httpx.post(url, json=body, headers=headers) for _ in range(2))
    assert first.status_code == again.status_code == 200 and first.json() == again.json()
    copy = first.json()["tinker_path"]
    assert copy == f"tinker://{session}:train:77/weights/trained"
    taken = httpx.post(url, json=body, headers={"X-API-Key": API_KEY})  # a new request, the same slot
    assert taken.status_code == 409 and "model_seq_id" in taken.json()["detail"]
    step = httpx.post(f"{server.url}/api/v1/optim_step", headers={"X-API-Key": API_KEY},
                      json={"model_id": f"{session}:train:77", "seq_id": 1, "adam_params": {"learning_rate": 1e-3}})
    assert step.status_code == 400 and "never trained" in step.json()["detail"]
    nowhere = httpx.post(url, json={"source_path": source}, headers={"X-API-Key": API_KEY})
    assert nowhere.status_code == 400 and "destination_project_id" in nowhere.json()["detail"]
