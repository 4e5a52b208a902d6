"""The `run_metrics` rows: what each training call of a run measured, for the console's curves.

Written in batches by one recorder thread (`tx/core/run_metrics.py`), read by the console's routes after the
caller was checked against the run. Bounded per run: `thin` drops every other row of each kind among a run's
older half, so a long run keeps its whole shape at a coarser grain and its recent steps at full detail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy import Text, cast, delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from tx.store.tables import RunMetricRow

DELETE_CHUNK = 500  # seq values per DELETE ... IN (...)


class MetricPoint(NamedTuple):
    """One row of `run_metrics`, without its run id."""

    seq: int
    step: int
    kind: str
    finished: float
    seconds: float
    tokens: int
    total_tokens: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class RunTotals:
    """A run's newest recorded call: how far it got."""

    calls: int  # seq of the newest row
    steps: int  # optimizer steps done (a forward or forward_backward after the last one is not a step yet)
    total_tokens: int
    last_finished: float
    rows: int


class RunMetricsTable:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    def add(self, rows: list[RunMetricRow]) -> None:
        with self._sessions.begin() as db:
            db.add_all(rows)

    def since(self, run_id: str, after_seq: int, limit: int) -> list[MetricPoint]:
        """The run's rows after `after_seq`, oldest first, at most `limit` (plain tuples: a page holds thousands).
        The metrics come as text and are decoded in one `json.loads` of them all: 20,000 rows in ~90 ms, where the
        JSON column's own decoding, row by row, took ~300 ms. Read through the connection, not the ORM session:
        its row loading cost ~100 ms more for 20,000 rows."""
        c = RunMetricRow
        query = (select(c.seq, c.step, c.kind, c.finished, c.seconds, c.tokens, c.total_tokens, cast(c.metrics, Text))
                 .where(c.run_id == run_id, c.seq > after_seq).order_by(c.seq).limit(limit))
        with self._sessions.begin() as db:
            rows = db.connection().execute(query).all()
        metrics = json.loads("[" + ",".join(row[7] or "null" for row in rows) + "]")
        return [MetricPoint(*row[:7], values or {}) for row, values in zip(rows, metrics)]

    def totals(self, run_ids: list[str]) -> dict[str, RunTotals]:
        """Each run's newest row's counters, and how many rows it keeps, in one query."""
        if not run_ids:
            return {}
        latest = (select(RunMetricRow.run_id, func.max(RunMetricRow.seq).label("seq"), func.count().label("rows"))
                  .where(RunMetricRow.run_id.in_(run_ids)).group_by(RunMetricRow.run_id).subquery())
        query = (select(RunMetricRow, latest.c.rows)
                 .join(latest, (RunMetricRow.run_id == latest.c.run_id) & (RunMetricRow.seq == latest.c.seq)))
        with self._sessions.begin() as db:
            return {row.run_id: RunTotals(row.seq, row.step if row.kind == "optim_step" else row.step - 1,
                                          row.total_tokens, row.finished, int(rows))
                    for row, rows in db.execute(query)}

    def last_values(self, run_ids: list[str], kind: str, name: str) -> dict[str, float]:
        """Each run's metric `name` in its newest row of `kind`, where it has one."""
        if not run_ids:
            return {}
        latest = (select(RunMetricRow.run_id, func.max(RunMetricRow.seq).label("seq"))
                  .where(RunMetricRow.run_id.in_(run_ids), RunMetricRow.kind == kind)
                  .group_by(RunMetricRow.run_id).subquery())
        query = (select(RunMetricRow.run_id, RunMetricRow.metrics)
                 .join(latest, (RunMetricRow.run_id == latest.c.run_id) & (RunMetricRow.seq == latest.c.seq)))
        with self._sessions.begin() as db:
            return {run_id: float(metrics[name]) for run_id, metrics in db.execute(query)
                    if isinstance(metrics, dict) and isinstance(metrics.get(name), (int, float))}

    def newest(self, run_id: str) -> RunMetricRow | None:
        query = select(RunMetricRow).where(RunMetricRow.run_id == run_id).order_by(RunMetricRow.seq.desc()).limit(1)
        with self._sessions.begin() as db:
            return db.scalars(query).first()

    def count(self, run_id: str) -> int:
        with self._sessions.begin() as db:
            return db.scalar(select(func.count()).select_from(RunMetricRow)
                             .where(RunMetricRow.run_id == run_id)) or 0

    def thin(self, run_id: str) -> int:
        """Drop every other row of each kind among the run's older half (by seq); returns how many went."""
        with self._sessions.begin() as db:
            rows = list(db.execute(select(RunMetricRow.seq, RunMetricRow.kind)
                                   .where(RunMetricRow.run_id == run_id).order_by(RunMetricRow.seq)))
            older = rows[: len(rows) // 2]
            by_kind: dict[str, list[int]] = {}
            for seq, kind in older:
                by_kind.setdefault(kind, []).append(seq)
            dropped = [seq for seqs in by_kind.values() for seq in seqs[1::2]]
            for start in range(0, len(dropped), DELETE_CHUNK):
                chunk = dropped[start:start + DELETE_CHUNK]
                db.execute(delete(RunMetricRow).where(RunMetricRow.run_id == run_id, RunMetricRow.seq.in_(chunk)))
            return len(dropped)
