"""Checkpoint lifecycle (rows 31-33, 35): publish/unpublish and who may read what, TTL and the
sweeper, the user's checkpoints paged with a cursor, and deletion freeing the disk."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
import tinker
from conftest import Trained
from tinker import types

from txserver import TxServer

OTHER_KEY = "tml-someone-else"


@pytest.fixture(scope="module")
def other(server: TxServer) -> Iterator[tinker.ServiceClient]:
    with server.client(OTHER_KEY) as client:
        yield client


def checkpoint_dir(server: TxServer, path: str):
    run, kind, name = path.removeprefix("tinker://").split("/")
    return server.data_dir / "checkpoints" / run / kind / name


def test_published_checkpoints_load_and_sample_for_any_key_and_only_then(
    server: TxServer, trained: Trained, other: tinker.ServiceClient
) -> None:
    state = trained.tc.save_state("to-publish").result().path
    sampler = trained.tc.save_weights_for_sampler("to-publish").result().path
    other_rest = tinker.RestClient(base_url=server.url, api_key=OTHER_KEY)
    prompt = types.ModelInput.from_ints(trained.tokens[:5])
    params = types.SamplingParams(max_tokens=2, temperature=0.0)

    def other_can_use() -> tuple[bool, bool]:
        try:
            other.create_training_client_from_state(state).result()
            loads = True
        except tinker.NotFoundError:
            loads = False
        try:
            other.create_sampling_client(model_path=sampler).sample(prompt, 1, params).result()
            samples = True
        except tinker.NotFoundError:
            samples = False
        return loads, samples

    assert other_can_use() == (False, False)
    for path in (state, sampler):
        with pytest.raises(tinker.NotFoundError):  # nobody but the owner publishes
            other_rest.publish_checkpoint_from_tinker_path(path).result()
        trained.rest.publish_checkpoint_from_tinker_path(path).result()
    listed = {c.tinker_path: c for c in trained.rest.list_checkpoints(trained.tc.model_id).result().checkpoints}
    assert listed[state].public and listed[sampler].public
    assert other_can_use() == (True, True)
    with pytest.raises(tinker.NotFoundError):  # published is readable, not the other key's to change
        other_rest.delete_checkpoint_from_tinker_path(state).result()
    with pytest.raises(tinker.NotFoundError):
        other_rest.list_checkpoints(trained.tc.model_id).result()
    for path in (state, sampler):
        trained.rest.unpublish_checkpoint_from_tinker_path(path).result()
    assert other_can_use() == (False, False)


def test_ttl_set_cleared_and_bounded(trained: Trained) -> None:
    path = trained.tc.save_state("ttl").result().path
    trained.rest.set_checkpoint_ttl_from_tinker_path(path, 7200).result()
    expires = {c.tinker_path: c.expires_at for c in trained.rest.list_user_checkpoints(limit=1000).result().checkpoints}
    assert timedelta(minutes=110) < expires[path] - datetime.now(timezone.utc) <= timedelta(hours=2)
    trained.rest.set_checkpoint_ttl_from_tinker_path(path, None).result()
    checkpoints = trained.rest.list_checkpoints(trained.tc.model_id).result().checkpoints
    assert next(c for c in checkpoints if c.tinker_path == path).expires_at is None
    with pytest.raises(tinker.BadRequestError, match="3600"):
        trained.rest.set_checkpoint_ttl_from_tinker_path(path, 60).result()


def test_an_expired_checkpoint_vanishes_and_the_sweeper_frees_its_disk(server: TxServer, trained: Trained) -> None:
    path = trained.tc.save_state("expiring", ttl_seconds=3600).result().path
    directory = checkpoint_dir(server, path)
    assert directory.is_dir()
    # An hour is the shortest TTL: move its expiry into the past instead of waiting.
    with sqlite3.connect(server.data_dir / "tx.db") as db:
        db.execute("UPDATE checkpoints SET expires_at = ? WHERE checkpoint_id = 'weights/expiring'",
                   ((datetime.now(timezone.utc) - timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S.%f"),))
    listed = [c.tinker_path for c in trained.rest.list_checkpoints(trained.tc.model_id).result().checkpoints]
    assert path not in listed
    assert path not in [c.tinker_path for c in trained.rest.list_user_checkpoints(limit=1000).result().checkpoints]
    deadline = time.monotonic() + 15
    while directory.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not directory.exists()  # the janitor (every second in these tests) deleted it


def test_user_checkpoints_page_with_a_cursor(server: TxServer) -> None:
    with server.client("tml-pager") as service:
        tc = service.create_lora_training_client("tiny-qwen3", rank=4).result()
        saved = [tc.save_state(f"p{i}").result().path for i in range(5)]
        rest = tinker.RestClient(base_url=server.url, api_key="tml-pager")
        pages = [rest.list_user_checkpoints(limit=2, offset=offset).result() for offset in (0, 2, 4)]
        assert [p.cursor.total_count for p in pages] == [5, 5, 5]
        assert [p.cursor.offset for p in pages] == [0, 2, 4]
        assert [c.tinker_path for p in pages for c in p.checkpoints] == saved[::-1]  # newest first


def test_deleting_frees_the_disk(server: TxServer, trained: Trained) -> None:
    path = trained.tc.save_state("doomed").result().path
    assert checkpoint_dir(server, path).is_dir()
    trained.rest.delete_checkpoint_from_tinker_path(path).result()
    assert not checkpoint_dir(server, path).exists()
    with pytest.raises(tinker.NotFoundError):
        trained.rest.delete_checkpoint_from_tinker_path(path).result()


def test_unpublish_and_delete_end_samplers_already_made(
    server: TxServer, trained: Trained, other: tinker.ServiceClient
) -> None:
    """The shared-server probe's finding 6: another key kept sampling from a checkpoint after it was unpublished,
    and after it was deleted, through a sampling client made while it was published."""
    path = trained.tc.save_weights_for_sampler("revoked").result().path
    trained.rest.publish_checkpoint_from_tinker_path(path).result()
    prompt = types.ModelInput.from_ints(trained.tokens[:5])
    params = types.SamplingParams(max_tokens=2, temperature=0.0)
    theirs = other.create_sampling_client(model_path=path).result()
    mine = trained.service.create_sampling_client(model_path=path).result()
    theirs.sample(prompt, 1, params).result()
    trained.rest.unpublish_checkpoint_from_tinker_path(path).result()
    with pytest.raises(tinker.NotFoundError, match="its owner unpublished or deleted"):
        theirs.sample(prompt, 1, params).result()
    mine.sample(prompt, 1, params).result()  # the owner's own client goes on
    trained.rest.publish_checkpoint_from_tinker_path(path).result()
    theirs.sample(prompt, 1, params).result()  # published again: readable again
    trained.rest.delete_checkpoint_from_tinker_path(path).result()
    for client in (theirs, mine):
        with pytest.raises(tinker.NotFoundError, match="unpublished or deleted"):
            client.sample(prompt, 1, params).result()
