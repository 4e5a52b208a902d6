"""The CPU thread budget (tx/cpu.py): how the trainer and the local engines split a machine's threads, and the
trainer taking its share on the training thread (tx/core/training.py -> TorchBackend.use_threads)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tx.cpu import (
    HUGE_PAGES_ENV,
    WAIT_POLICY_ENV,
    ThreadBudget,
    _cgroup_quota,
    split_threads,
    use_cpu_defaults,
    use_huge_pages,
)


@pytest.mark.parametrize(("total", "engines", "trainer", "engine"), [
    (2, 1, 1, 1),  # this box: one thread each, never three on two cores
    (16, 1, 8, 8),
    (16, 3, 4, 4),
    (3, 4, 1, 1),  # more engines than cores: one thread each, and a warning
    (8, 0, 8, 8),  # no local engine (Ray, external engines): the trainer has it all
])
def test_default_split(total: int, engines: int, trainer: int, engine: int) -> None:
    budget = split_threads(total, engines)
    assert (budget.trainer, budget.engine) == (trainer, engine)
    assert budget.trainer_threads(engines_running=False) == total  # engines start lazily
    assert budget.trainer_threads(engines_running=True) == (trainer if engines else total)


def test_settings_override_each_side(caplog: pytest.LogCaptureFixture) -> None:
    assert split_threads(16, 1, engine=2) == ThreadBudget(total=16, trainer=14, engine=2, local_engines=1)
    assert split_threads(16, 2, trainer=10) == ThreadBudget(total=16, trainer=10, engine=5, local_engines=2)
    with caplog.at_level(logging.WARNING, logger="tx.cpu"):
        budget = split_threads(2, 1, trainer=2, engine=2)  # the operator's choice is kept
    assert (budget.trainer, budget.engine, budget.oversubscribed) == (2, 2, True)
    assert "contend for cores" in caplog.text


def test_total_defaults_to_the_cpus_this_process_may_use() -> None:
    import os

    assert split_threads(None, 0).total == min(len(os.sched_getaffinity(0)), _cgroup_quota() or 10**6)


@pytest.mark.parametrize(("text", "cpus"), [("max 100000", None), ("150000 100000", 1), ("400000 100000", 4)])
def test_cgroup_quota(tmp_path: Path, text: str, cpus: int | None) -> None:
    (tmp_path / "cpu.max").write_text(text + "\n")
    assert _cgroup_quota(tmp_path / "cpu.max") == cpus
    assert _cgroup_quota(tmp_path / "absent") is None


def test_huge_pages_unless_the_environment_says() -> None:
    env: dict[str, str] = {}
    use_huge_pages(env)
    assert env == {HUGE_PAGES_ENV: "1"}
    env = {HUGE_PAGES_ENV: "0"}
    use_huge_pages(env)
    assert env == {HUGE_PAGES_ENV: "0"}


def test_openmp_threads_sleep_while_they_wait_unless_the_environment_says() -> None:
    env: dict[str, str] = {}
    use_cpu_defaults(env)
    assert env == {HUGE_PAGES_ENV: "1", WAIT_POLICY_ENV: "PASSIVE"}
    env = {WAIT_POLICY_ENV: "ACTIVE", HUGE_PAGES_ENV: "0"}
    use_cpu_defaults(env)
    assert env == {WAIT_POLICY_ENV: "ACTIVE", HUGE_PAGES_ENV: "0"}
