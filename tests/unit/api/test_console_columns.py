"""The run page's metric columns: built a column at a time, each value as the per-value code wrote it."""

from __future__ import annotations

import math

import numpy as np

from tx.api.routes.console import _columns, _short, _shorts
from tx.store.metrics import MetricPoint


def test_shorts_round_as_six_significant_digits_one_at_a_time_did() -> None:
    rng = np.random.default_rng(0)
    values: list[float | None] = [float(v) for v in rng.normal(size=5000) * 10.0 ** rng.integers(-300, 300, size=5000)]
    values += [0.0, -0.0, 1e-310, 5e-324, 1.7e308, 999999.5, 9.999995, 3.0999999046325684, math.inf, -math.inf, None]
    got = _shorts(values)
    for value, short in zip(values, got, strict=True):
        if value is None:
            assert short is None
        else:
            assert short == _short(value) and math.copysign(1, short) == math.copysign(1, value), (value, short)


def test_columns_hold_each_call_and_null_where_a_call_has_no_such_metric() -> None:
    rows = [MetricPoint(1, 1, "forward_backward", 100.12345, 0.0512345678, 8, 8, {"loss_sum": 1.23456789}),
            MetricPoint(2, 1, "optim_step", 100.5, 0.01, 0, 8, {"grad_norm": 0.5})]
    columns = _columns(rows)
    assert (columns.seq, columns.kind, columns.finished, columns.seconds) == (
        [1, 2], ["forward_backward", "optim_step"], [100.123, 100.5], [0.0512346, 0.01])
    assert columns.metrics == {"grad_norm": [None, 0.5], "loss_sum": [1.23457, None]}
    assert _columns([]).seq == []
