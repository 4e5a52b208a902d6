"""The run page's kept metric columns (`MetricsCache`): an answer only at the rows it was read at, replaced per run,
bounded by bytes with the least recently read dropped first."""

from __future__ import annotations

from tx.api.console_metrics import MetricsCache


def test_a_kept_answer_is_given_only_while_the_run_records_what_it_did_when_read() -> None:
    cache = MetricsCache()
    cache.put("run-a", 20_000, (200, 200), b"columns")
    assert cache.get("run-a", 20_000, (200, 200)) == b"columns"
    assert cache.get("run-a", 20_000, (201, 201)) is None  # a call recorded since
    assert cache.get("run-a", 20_000, (200, 150)) is None  # thinned since
    assert cache.get("run-a", 100, (200, 200)) is None  # another limit read other rows
    assert cache.get("run-b", 20_000, (200, 200)) is None
    cache.put("run-a", 20_000, (201, 201), b"newer")  # replaces the run's older answer
    assert cache.get("run-a", 20_000, (201, 201)) == b"newer" and cache.bytes == len(b"newer")


def test_the_least_recently_read_go_first_past_the_byte_budget() -> None:
    cache = MetricsCache(max_bytes=10)
    cache.put("a", 1, (1, 1), b"aaaa")
    cache.put("b", 1, (1, 1), b"bbbb")
    assert cache.get("a", 1, (1, 1)) == b"aaaa"  # read: b is now the least recent
    cache.put("c", 1, (1, 1), b"cccc")
    assert cache.get("b", 1, (1, 1)) is None and cache.get("a", 1, (1, 1)) == b"aaaa"
    assert cache.get("c", 1, (1, 1)) == b"cccc" and cache.bytes == 8
    cache.put("a", 1, (2, 2), b"x" * 11)  # too big to keep: not kept, and a's older answer is gone
    assert cache.get("a", 1, (2, 2)) is None and cache.get("a", 1, (1, 1)) is None and cache.bytes == 4
