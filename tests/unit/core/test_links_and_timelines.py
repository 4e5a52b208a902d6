"""Signed download links, session timelines and their trace, and the retrieve_futures feed."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from tx.core.checkpoints.downloads import KEY_FILE, DownloadSigner, LinkScope
from tx.core.completions import CompletionFeeds
from tx.core.timeline import SessionTimeline, Span, chrome_trace
from tx.types import NotFoundError

SCOPE = LinkScope(kind="file", owner="alice", run_id="s:train:0", checkpoint_id="external_weights/x",
                  file="adapter_model.safetensors")


def test_a_link_opens_exactly_its_scope_until_it_expires(tmp_path) -> None:
    signer = DownloadSigner.from_data_dir(tmp_path, ttl_s=60)
    token, expires = signer.sign(SCOPE, now=1000.0)
    assert expires == 1060.0 and signer.verify(token, now=1059.0) == SCOPE
    with pytest.raises(NotFoundError, match="expired"):
        signer.verify(token, now=1060.0)
    payload, mac = token.split(".")
    other, _ = signer.sign(LinkScope(kind="file", owner="alice", run_id="s:train:0",
                                     checkpoint_id="external_weights/x", file="adapter_config.json"), now=1000.0)
    with pytest.raises(NotFoundError, match="invalid"):  # another link's payload under this mac
        signer.verify(f"{other.split('.')[0]}.{mac}", now=1001.0)
    for garbage in ("garbage", "a.b", ".", "\u00e9.\u00e9", "\ud800.x", f"{payload}.{mac}\u00e9"):
        with pytest.raises(NotFoundError, match="invalid"):
            signer.verify(garbage, now=1001.0)


def test_the_key_is_kept_private_and_survives_a_restart(tmp_path) -> None:
    token, _ = DownloadSigner.from_data_dir(tmp_path, 60).sign(SCOPE)
    assert DownloadSigner.from_data_dir(tmp_path, 60).verify(token) == SCOPE
    assert os.stat(tmp_path / KEY_FILE).st_mode & 0o777 == 0o600
    with pytest.raises(NotFoundError):
        DownloadSigner.from_data_dir(tmp_path / "other", 60).verify(token)


def test_timeline_makes_a_chrome_trace_with_a_track_per_run() -> None:
    timeline = SessionTimeline(max_spans=3, max_sessions=1)
    for i in range(4):
        timeline.record("s1", Span(f"r{i}", "ForwardBackward", "s1:train:0", 10.0 + i, 10.5 + i, 11.0 + i, False))
    timeline.record("s1", Span("c", "Sample", "s1:sample:0", 20.0, None, 20.1, True))
    trace = chrome_trace("s1", timeline.spans("s1"))
    json.dumps(trace)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in slices] == ["ForwardBackward (queued)", "ForwardBackward"] * 2 + ["Sample (queued)"]
    assert slices[1]["ts"] == 12_500_000 and slices[1]["dur"] == 500_000  # r0 dropped: 3 spans kept
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"s1:train:0", "s1:sample:0"}
    timeline.record("s2", Span("x", "Sample", "t", 1, 1, 2, False))
    assert timeline.spans("s1") == []  # one session kept


def test_feed_long_polls_and_forgets_what_was_seen() -> None:
    async def main() -> None:
        feeds = CompletionFeeds()
        target = ("sampler", 0)
        waiting = asyncio.create_task(feeds.poll(target, 0, timeout_s=5))
        await asyncio.sleep(0.05)
        feeds.publish(target, "a", failed=False)
        events, cursor = await asyncio.wait_for(waiting, 1)
        assert [(e.request_id, e.failed) for e in events] == [("a", False)] and cursor == 1
        feeds.publish(target, "b", failed=True)
        events, cursor = await feeds.poll(target, cursor, timeout_s=0)
        assert [e.request_id for e in events] == ["b"] and cursor == 2
        assert await feeds.poll(target, 2, timeout_s=0) == ([], 2)
        assert await feeds.poll(("other", 0), 0, timeout_s=0.01) == ([], 0)

    asyncio.run(main())


def test_feeds_hold_a_bounded_number_of_events_dropping_unpolled_feeds_first() -> None:
    async def main() -> None:
        feeds = CompletionFeeds(max_events=3)
        await feeds.poll(("polled", 0), 0, timeout_s=0)
        feeds.publish(("polled", 0), "a", failed=False)
        for i in range(3):  # nobody polls this one
            feeds.publish(("ignored", 0), f"x{i}", failed=False)
        assert [e.request_id for e in (await feeds.poll(("polled", 0), 0, timeout_s=0))[0]] == ["a"]
        assert (await feeds.poll(("ignored", 0), 0, timeout_s=0))[0] == []  # dropped whole

    asyncio.run(main())


@pytest.mark.parametrize("left", ["", "\n", "abc", "00" * 8])
def test_an_empty_or_broken_key_file_is_replaced_never_used(tmp_path, left: str) -> None:
    """The shared-server probe's finding 7: an empty download.key (a crash between create and write) was taken
    as the HMAC key, so anyone could sign links."""
    (tmp_path / KEY_FILE).write_text(left)
    signer = DownloadSigner.from_data_dir(tmp_path, 60)
    key = bytes.fromhex((tmp_path / KEY_FILE).read_text())
    assert len(key) == 32 and os.stat(tmp_path / KEY_FILE).st_mode & 0o777 == 0o600
    forged = DownloadSigner(bytes.fromhex(left.strip()) if left.strip() in ("", "00" * 8) else b"", 60)
    token, _ = forged.sign(SCOPE)
    with pytest.raises(NotFoundError, match="invalid"):
        signer.verify(token)
    assert DownloadSigner.from_data_dir(tmp_path, 60).verify(signer.sign(SCOPE)[0]) == SCOPE
