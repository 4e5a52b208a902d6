"""Per-step metrics (tx/core/run_metrics.py): every training call leaves a row, written off the training
thread; steps group forward_backward calls with the optim_step that ends them; an RL loss's own outputs are
there; a run's rows stay under their bound with the run's shape kept."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from test_core_in_process import OWNER, Core, run

from tx.core.run_metrics import Measured, MetricsRecorder, forward_metrics
from tx.optimizers import AdamParams
from tx.store.store import Store
from tx.store.tables import TrainingRunRow
from tx.types import Datum, ForwardBackwardInput, ForwardBackwardResult, ModelInput, OptimStepResult


def test_a_step_records_loss_per_token_tokens_and_the_optimizer_step(tmp_path: Path) -> None:
    async def scenario(core: Core) -> None:
        model = await core.new_model()
        for step in range(2):
            await core.done(core.forward_backward(model, 2 * step + 1, tokens=(5, 6, 7, 8)))
            await core.done(core.service.training.optim_step(OWNER, model, 2 * step + 2, AdamParams(learning_rate=0.5)))
        core.service.recorder.flush()
        rows = core.store.metrics.since(model, 0, 100)
        assert [(r.seq, r.step, r.kind) for r in rows] == [
            (1, 1, "forward_backward"), (2, 1, "optim_step"), (3, 2, "forward_backward"), (4, 2, "optim_step")]
        first, second = rows[0], rows[2]
        assert first.tokens == 4 and second.total_tokens == 8
        assert first.metrics["loss_per_token"] == 0.0 and second.metrics["loss_per_token"] == 0.5  # fake: w * 1
        assert rows[1].metrics == {"learning_rate:mean": 0.5}
        assert all(r.seconds >= 0 and r.finished > 0 for r in rows)
        totals = core.store.metrics.totals([model])[model]
        assert (totals.calls, totals.steps, totals.total_tokens, totals.rows) == (4, 2, 8, 4)

    run(tmp_path, scenario)


def rl_batch(q: list[float], advantages: list[float], loss: str = "ppo") -> ForwardBackwardInput:
    n = len(q)
    inputs = {"target_tokens": np.arange(n), "logprobs": np.array(q, np.float32),
              "advantages": np.array(advantages, np.float32)}
    return ForwardBackwardInput([Datum(ModelInput.from_tokens(list(range(n))), inputs)], loss)


def test_an_rl_loss_records_its_ratio_kl_clipped_share_and_advantages() -> None:
    # prompt position 0 (q = 0, A = 0) is left out; sampled positions: ratios e^0, e^0.5, e^-0.1
    batch = rl_batch([0.0, -1.0, -2.0, -0.5], [0.0, 1.0, 1.0, -1.0])
    trainer = np.array([-3.0, -1.0, -1.5, -0.6], np.float32)
    result = ForwardBackwardResult([{"logprobs": trainer}], {"loss:sum": -1.5})
    tokens, metrics = forward_metrics(batch, result, seconds=0.5)
    assert tokens == 4 and metrics["tokens_per_s"] == 8.0
    assert metrics["sampled_tokens"] == 3 and math.isclose(metrics["loss_per_token"], -0.5)
    ratios = np.exp([0.0, 0.5, -0.1])
    assert math.isclose(metrics["ratio_mean"], ratios.mean(), rel_tol=1e-6)
    assert math.isclose(metrics["kl_sampler_trainer"], -(0.0 + 0.5 - 0.1) / 3, rel_tol=1e-5)
    assert math.isclose(metrics["clip_fraction"], 1 / 3)  # e^0.5 > 1.2
    assert math.isclose(metrics["advantage_mean"], 1 / 3) and metrics["advantage_abs_mean"] == 1.0


def test_cross_entropy_loss_is_per_unit_of_weight_and_custom_metrics_are_kept() -> None:
    inputs = {"target_tokens": np.arange(4), "weights": np.array([0, 0, 1, 1], np.float32)}
    batch = ForwardBackwardInput([Datum(ModelInput.from_tokens([1, 2, 3, 4]), inputs)], "cross_entropy")
    result = ForwardBackwardResult([{"logprobs": np.zeros(4, np.float32)}],
                                   {"loss:sum": 3.0, "custom/reward:mean": 0.75, "bad:mean": math.nan})
    _, metrics = forward_metrics(batch, result, seconds=0.0)
    assert metrics["loss_per_token"] == 1.5 and metrics["custom/reward:mean"] == 0.75
    assert "bad:mean" not in metrics and "tokens_per_s" not in metrics  # no NaN reaches the store


def test_a_run_past_its_bound_is_thinned_oldest_first_keeping_every_kind(tmp_path: Path) -> None:
    store = Store.from_url(f"sqlite:///{tmp_path / 'tx.db'}")
    from tx.store.tables import SessionRow

    store.create_session(SessionRow(session_id="s", owner=OWNER))
    store.create_run(TrainingRunRow(run_id="r", session_id="s", owner=OWNER, base_model="b", lora_rank=1,
                                    lora_config={}))
    recorder = MetricsRecorder(store.metrics, max_rows=100)
    try:
        fb = ForwardBackwardResult([{"logprobs": np.zeros(2, np.float32)}], {"loss:sum": 1.0})
        for _ in range(200):  # 400 rows: forward_backward and optim_step alternate
            recorder.record(Measured("r", "forward_backward", 1.0, 0.1, None, fb))
            recorder.record(Measured("r", "optim_step", 1.0, 0.1, None, OptimStepResult({"grad_norm": 1.0})))
        recorder.flush()
        rows = store.metrics.since("r", 0, 10_000)
        assert len(rows) <= 100
        assert rows[-1].seq == 400 and rows[-1].step == 200 and rows[-1].total_tokens == 400  # the newest stays
        assert rows[0].seq == 1  # so does the first
        kinds = {r.kind for r in rows[: len(rows) // 4]}
        assert kinds == {"forward_backward", "optim_step"}  # old steps still show both curves
        newest = [r.seq for r in rows[-20:]]
        assert newest == list(range(381, 401))  # the newest rows at full detail
    finally:
        recorder.close()
        store.close()
