"""The web console in a real headless Chromium (tests/browser.py) against a live `tx serve` with three keys:
alice and bob (tenants) and an operator key. A run trains through the SDK while the browser watches.

Screenshots of each page go to $TX_CONSOLE_SHOTS (default: the test's temporary directory)."""

from __future__ import annotations

import os
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from browser import Browser, Page, chromium_path
from sdk_datums import sft_datum
from tinker import types
from txserver import API_KEY, TxServer

from tx.api.auth import owner_of
from tx.api.wire.schemas.console import RunMetrics

ALICE, BOB, OPERATOR = API_KEY, "tml-bob-key", "tml-operator-key"
LOAD_BUDGET_MS = 300
BOB_LABEL, OPERATOR_LABEL = "bob (research)", "ops desk"  # bob's labelled by his key, the operator's by owner id


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    args = ["--api-key", ALICE, "--api-key", BOB, "--api-key", OPERATOR, "--operator-key", OPERATOR,
            "--key-label", f"{BOB}={BOB_LABEL}", "--key-label", f"{owner_of(OPERATOR)}={OPERATOR_LABEL}"]
    with TxServer(tmp_path_factory.mktemp("tx-console"), args=args) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if chromium_path() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    started = Browser.start(tmp_path_factory.mktemp("chromium"))
    yield started
    started.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    return Path(os.environ.get("TX_CONSOLE_SHOTS") or tmp_path)


@pytest.fixture
def page(browser: Browser, console_server: TxServer) -> Iterator[Page]:
    opened = browser.page()
    yield opened
    off_host = [url for url in opened.requests if not url.startswith((console_server.url, "data:", "about:"))]
    opened.close()
    assert off_host == [], "the console asked another host for something"
    assert opened.errors == [], opened.errors


def sign_in(page: Page, server: TxServer, key: str) -> None:
    page.goto(f"{server.url}/console#/runs")
    page.wait_for("document.querySelector('#api-key') || document.body.dataset.ready === 'runs'")
    if page.evaluate("!!document.querySelector('#sign-out')"):
        page.click("#sign-out")
        page.wait_for("document.querySelector('#api-key')")
    page.fill("#api-key", key)
    page.click("#signin button[type=submit]")
    page.wait_for("document.body.dataset.ready === 'runs'", what="the runs page after sign-in")


def chart_points(page: Page, title: str) -> int:
    return int(page.evaluate(f"(document.querySelector('.chart[data-title=\"{title}\"]') || {{dataset: {{}}}}).dataset.points || 0"))


def test_a_run_appears_and_its_loss_curve_gains_points_while_it_trains(
        page: Page, console_server: TxServer, shots: Path) -> None:
    sign_in(page, console_server, ALICE)
    with console_server.client(ALICE) as service:
        training = service.create_lora_training_client("tiny-qwen3", rank=4, seed=0).result()
        tokens = np.random.default_rng(0).integers(10, 1990, size=33).tolist()
        go, stop = threading.Event(), threading.Event()

        def train() -> None:
            while not stop.is_set():
                go.wait()
                training.forward_backward([sft_datum(tokens)], "cross_entropy").result()
                training.optim_step(types.AdamParams(learning_rate=1e-2)).result()

        trainer = threading.Thread(target=train, daemon=True)
        trainer.start()
        try:
            go.set()
            run = training.model_id
            page.wait_for(f"document.querySelector('#runs tr[data-run=\"{run}\"]')", what="the run in the list")
            page.wait_for(f"Number(document.querySelector('#runs tr[data-run=\"{run}\"] .steps').textContent) >= 2")
            page.screenshot(shots / "runs.png")
            page.click(f"#runs tr[data-run=\"{run}\"] a")
            page.wait_for("document.body.dataset.ready === 'runs' && document.querySelector('#charts .chart')")
            first = page.wait_for("Number(document.querySelector('.chart[data-title=\"loss per token\"]')?.dataset.points)")
            later = page.wait_for(f"Number(document.querySelector('.chart[data-title=\"loss per token\"]')?.dataset.points) >= {first + 3}"
                                  f" && document.querySelector('.chart[data-title=\"loss per token\"]').dataset.points",
                                  what="the loss curve to gain points as steps land")
            assert int(later) >= first + 3
            assert chart_points(page, "grad norm") > 0 and chart_points(page, "learning rate") > 0
            assert page.evaluate("document.querySelector('#run-info').textContent").count(run) == 1
            page.screenshot(shots / "run.png")
        finally:
            stop.set()
            trainer.join(60)


def test_publish_from_the_console_changes_what_another_key_can_read(
        page: Page, console_server: TxServer, shots: Path) -> None:
    with console_server.client(ALICE) as alice, console_server.client(BOB) as bob:
        training = alice.create_lora_training_client("tiny-qwen3", rank=4).result()
        path = training.save_weights_for_sampler("to-share").result().path
        bob_rest = bob.create_rest_client()
        with pytest.raises(tinker.NotFoundError):
            bob_rest.get_weights_info_by_tinker_path(path).result()
        sign_in(page, console_server, ALICE)
        page.goto(f"{console_server.url}/console#/checkpoints")
        row = f"#checkpoints tr[data-path=\"{path}\"]"
        page.wait_for(f"document.body.dataset.ready === 'checkpoints' && document.querySelector('{row}')")
        page.click(f"{row} button.publish")
        page.wait_for(f"document.querySelector('{row} .pill.public')", what="the checkpoint shown public")
        assert bob_rest.get_weights_info_by_tinker_path(path).result().base_model == "tiny-qwen3"
        page.screenshot(shots / "checkpoints.png")
        page.click(f"{row} button.unpublish")
        page.wait_for(f"document.querySelector('{row} button.publish')")
        with pytest.raises(tinker.NotFoundError):
            bob_rest.get_weights_info_by_tinker_path(path).result()


def test_the_playground_samples_with_per_token_logprobs(page: Page, console_server: TxServer, shots: Path) -> None:
    with console_server.client(ALICE) as alice:
        training = alice.create_lora_training_client("tiny-qwen3", rank=4).result()
        path = training.save_weights_for_sampler("playground").result().path
    sign_in(page, console_server, ALICE)
    page.goto(f"{console_server.url}/console#/playground")
    page.wait_for("document.body.dataset.ready === 'playground'")
    page.fill("#model", path)
    page.fill("#mode", "text")
    page.fill("#prompt-text", "Once upon a time")
    page.fill("#max-tokens", "12")
    page.fill("#n", "2")
    page.click("#sample")
    page.wait_for("document.querySelectorAll('#samples .sample').length === 2", timeout_s=180, what="two samples")
    logprobs = page.evaluate("[...document.querySelectorAll('#samples .tok')].map(t => Number(t.dataset.logprob))")
    assert 2 <= len(logprobs) <= 24 and all(lp <= 0 for lp in logprobs)  # up to 12 each (a sample may stop early)
    colours = page.evaluate("new Set([...document.querySelectorAll('#samples .tok')].map(t => t.style.background)).size")
    assert colours > 1  # coloured by logprob
    page.screenshot(shots / "playground.png")


def test_a_tenant_key_never_sees_another_tenants_run(page: Page, console_server: TxServer, shots: Path) -> None:
    with console_server.client(ALICE) as alice:
        training = alice.create_lora_training_client("tiny-qwen3", rank=4).result()
        training.forward_backward([sft_datum(list(range(10, 30)))], "cross_entropy").result()
        run, session = training.model_id, alice.holder._session_id
        sign_in(page, console_server, BOB)
        page.goto(f"{console_server.url}/console#/runs")
        page.wait_for("document.body.dataset.ready === 'runs'")
        assert not page.evaluate(f"document.body.innerText.includes('{run}')")
        page.goto(f"{console_server.url}/console#/runs/{run}")
        # the list page left dataset.ready at 'runs' already: wait for the run page's own answer
        page.wait_for("document.body.dataset.ready === 'runs' && document.querySelector('main .error')")
        assert page.evaluate("document.querySelector('main .error').textContent").startswith("404")
        page.goto(f"{console_server.url}/console#/sessions")
        page.wait_for("document.body.dataset.ready === 'sessions'")
        assert not page.evaluate(f"document.body.innerText.includes('{session}')")
        assert not page.evaluate("!!document.querySelector('#nav-engines')")  # a tenant has no engines page

        sign_in(page, console_server, OPERATOR)  # an operator key sees every tenant's
        page.wait_for(f"document.querySelector('#runs tr[data-run=\"{run}\"]')")
        page.goto(f"{console_server.url}/console#/sessions")
        page.wait_for(f"document.body.dataset.ready === 'sessions' && document.body.innerText.includes('{session}')")
        page.screenshot(shots / "sessions.png")
        page.goto(f"{console_server.url}/console#/sessions/{session}")
        page.wait_for("document.body.dataset.ready === 'sessions' && document.querySelector('#timeline rect.span')")
        page.screenshot(shots / "session-timeline.png")
        page.goto(f"{console_server.url}/console#/engines")
        page.wait_for("document.body.dataset.ready === 'engines' && document.querySelector('#engines tr[data-engine]')")
        owner = tinker.RestClient(base_url=console_server.url, api_key=ALICE).get_training_run(run).result().model_owner
        row = f"#usage tr[data-owner=\"{owner}\"]"  # every key's use of its quotas, alice's run among hers
        page.wait_for(f"document.querySelector('{row}')")
        assert page.evaluate(f"document.querySelector('{row}').children[2].textContent").split(" / ")[0] != "0"
        page.screenshot(shots / "engines.png")


def seed_steps(server: TxServer, run_id: str, steps: int) -> None:
    """`steps` forward_backward + optim_step rows for `run_id`, written by the server's own recorder code into its
    store, as 1,000 real steps would leave them (training them through the SDK would take minutes)."""
    from tx.core.run_metrics import Measured, MetricsRecorder
    from tx.store.store import Store
    from tx.types import ForwardBackwardResult, OptimStepResult

    store = Store.from_url(f"sqlite:///{server.data_dir / 'tx.db'}")
    recorder = MetricsRecorder(store.metrics)
    try:
        start = time.time() - steps
        for step in range(steps):
            loss = 3.0 * np.exp(-step / 300) + 0.1
            fb = ForwardBackwardResult([{"logprobs": np.zeros(256, np.float32)}], {"loss:sum": loss * 256})
            recorder.record(Measured(run_id, "forward_backward", start + step, 0.05, None, fb))
            recorder.record(Measured(run_id, "optim_step", start + step + 0.05, 0.01, None,
                                     OptimStepResult({"grad_norm": 1.0 / (1 + step), "learning_rate": 1e-4})))
        recorder.flush(30)
    finally:
        recorder.close()
        store.close()


def test_every_page_loads_under_300_ms_with_1000_steps_recorded(
        page: Page, console_server: TxServer, shots: Path) -> None:
    with console_server.client(ALICE) as alice:
        run = alice.create_lora_training_client("tiny-qwen3", rank=4).result().model_id
        seed_steps(console_server, run, 1000)
        sign_in(page, console_server, OPERATOR)
        pages = {"runs": "#/runs", "run": f"#/runs/{run}", "checkpoints": "#/checkpoints", "sessions": "#/sessions",
                 "session": f"#/sessions/{alice.holder._session_id}", "engines": "#/engines", "playground": "#/playground"}
        best: dict[str, float] = {}
        median: dict[str, float] = {}
        for name, hash_ in pages.items():
            samples = warm_loads(page, f"{console_server.url}/console{hash_}", name)
            best[name], median[name] = min(samples), statistics.median(samples)
            if name == "run":
                assert chart_points(page, "loss per token") == 1000
                # early.js asked the run's metrics and checkpoints while the page was still being parsed (the
                # modules run after that); the page took those answers: each was asked once
                asked = page.evaluate("performance.getEntriesByType('resource')"
                                      ".filter((e) => /[/]metrics[?]after_seq=0$|[/]checkpoints[?]run_id=/.test(e.name))"
                                      ".map((e) => [e.name, e.startTime])")
                parsed = page.evaluate("performance.getEntriesByType('navigation')[0].domInteractive")
                assert len(asked) == 2 and all(start < parsed for _, start in asked), (asked, parsed)
                page.screenshot(shots / "run-1000-steps.png")
        print(f"console page load, navigation start to data drawn, ms (5 warm loads; load average "
              f"{os.getloadavg()[0]:.1f}): best {_rounded(best)}, median {_rounded(median)}")
        # The best of five, against 300 ms on a quiet box. On a box running more than one runnable process per
        # core (others' test runs), every load waits its turn for a core: the budget grows by that factor, so
        # the test measures the console rather than the neighbours (CI runs alone: the plain 300 ms).
        budget = LOAD_BUDGET_MS * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
        assert max(best.values()) < budget, (best, budget)


def warm_loads(page: Page, url: str, what: str, loads: int = 5) -> list[float]:
    """ms from navigation start to data drawn, of `loads` reloads (F5) of `url` after one load that fills the
    browser's cache. A reload keeps the tab's renderer process; a load from about:blank starts a new one in
    headless Chromium (no spare process is kept), which adds ~150 ms of the browser's own before the page's first
    byte of script runs (README.md#console)."""
    page.goto(url)
    page.wait_for("document.body.dataset.ready && window.txReadyMs !== undefined", what=f"{what} to load")
    samples = []
    for _ in range(loads):
        page.reload()
        page.wait_for("document.body.dataset.ready && window.txReadyMs !== undefined", what=f"{what} to reload")
        samples.append(float(page.evaluate("window.txReadyMs")))
    return samples


def test_the_run_page_loads_under_300_ms_with_20000_points(page: Page, console_server: TxServer, shots: Path) -> None:
    """The most one run's page reads (MAX_POINTS, 20,000 recorded calls: 10,000 steps of forward_backward and
    optim_step), each chart 10,000 points, within the page budget (issue 41). Prints the figure."""
    with console_server.client(ALICE) as alice:
        run = alice.create_lora_training_client("tiny-qwen3", rank=4).result().model_id
        seed_steps(console_server, run, 10_000)
        sign_in(page, console_server, ALICE)
        samples = warm_loads(page, f"{console_server.url}/console#/runs/{run}", "the run page")
        assert chart_points(page, "loss per token") == 10_000
        page.screenshot(shots / "run-20000-points.png")
        print(f"run page with 20,000 recorded calls, ms (5 warm loads; load average {os.getloadavg()[0]:.1f}): "
              f"best {min(samples):.0f}, median {statistics.median(samples):.0f}")
        budget = LOAD_BUDGET_MS * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))  # as the test above
        assert min(samples) < budget, (samples, budget)


def _rounded(timings: dict[str, float]) -> dict[str, float]:
    return {k: round(v) for k, v in timings.items()}


def seed_calls(server: TxServer, run_id: str, calls: list[tuple[str, float]]) -> None:
    """One recorded call per (kind, loss per token) for `run_id`: forward_backward and forward calls with that
    loss over 256 tokens, optim_step calls with a learning rate that decays; through the server's own recorder
    (as `seed_steps`)."""
    from tx.core.run_metrics import Measured, MetricsRecorder
    from tx.store.store import Store
    from tx.types import ForwardBackwardResult, OptimStepResult

    store = Store.from_url(f"sqlite:///{server.data_dir / 'tx.db'}")
    recorder = MetricsRecorder(store.metrics)
    try:
        start = time.time() - len(calls)
        for i, (kind, loss) in enumerate(calls):
            if kind == "optim_step":
                result = OptimStepResult({"grad_norm": 1.0, "learning_rate": 1e-3 / (1 + i)})
            else:
                result = ForwardBackwardResult([{"logprobs": np.zeros(256, np.float32)}], {"loss:sum": loss * 256})
            recorder.record(Measured(run_id, kind, start + i, 0.05, None, result))
        recorder.flush(30)
    finally:
        recorder.close()
        store.close()


LOSS = "document.querySelector('.chart[data-title=\"loss per token\"]')"


def mouse(page: Page, kind: str, x: float, y: float, **extra: object) -> None:
    page.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, **extra)


def test_charts_draw_every_point_negative_and_single_and_keep_zoom_and_readout_across_updates(
        page: Page, console_server: TxServer, shots: Path) -> None:
    with console_server.client(ALICE) as alice:
        run = alice.create_lora_training_client("tiny-qwen3", rank=4).result().model_id
        # an RL loss around 0 (importance sampling: +-1e-9 and negative), then one evaluation forward
        losses = [0.5, -1e-9, 1e-9, -0.3, 0.2]
        seed_calls(console_server, run, [c for loss in losses for c in (("forward_backward", loss), ("optim_step", 0.0))]
                   + [("forward", 2.0)])
        sign_in(page, console_server, ALICE)
        page.goto(f"{console_server.url}/console#/runs/{run}")
        page.wait_for(f"document.body.dataset.ready === 'runs' && {LOSS} && {LOSS}.txChart.u", what="the loss chart")
        assert chart_points(page, "loss per token") == 6  # five steps and the forward: none dropped
        assert page.evaluate("document.querySelector('#run-steps').textContent") == "5 steps"  # the forward is no step
        assert page.evaluate(f"{LOSS}.txChart.u.scales.y.min") <= -0.3  # the negative loss is inside the plot
        # the one forward point is drawn: coloured pixels around where it sits on the canvas
        drawn = page.evaluate(f"""(() => {{ const u = {LOSS}.txChart.u, si = u.series.findIndex((s) => s.label === '(forward)');
            const col = u.data[si], i = col.findIndex((v) => v !== null);
            const x = Math.round(u.valToPos(u.data[0][i], 'x', true)), y = Math.round(u.valToPos(col[i], 'y', true));
            const px = u.ctx.getImageData(x - 4, y - 4, 9, 9).data; let n = 0;
            for (let k = 0; k < px.length; k += 4) if (px[k + 3] > 0 && Math.max(px[k], px[k + 1], px[k + 2]) - Math.min(px[k], px[k + 1], px[k + 2]) > 40) n++;
            return n; }})()""")
        assert drawn > 3, drawn
        config = page.evaluate("document.querySelector('#run-config').textContent")
        assert "learning rate5.00e-4 → 1.00e-4" in config and "forward 1" in config  # the seeded decay, as given
        # log asked for where values are <= 0: symlog, said so, and still every point; ticks on the axis
        page.fill("#y-scale", "log")
        page.wait_for(f"{LOSS}.querySelector('.scale-note').textContent.includes('symlog')")
        assert chart_points(page, "loss per token") == 6 and int(page.evaluate(f"{LOSS}.dataset.yticks")) >= 3
        page.fill("#y-scale", "linear")
        page.wait_for(f"!{LOSS}.querySelector('.scale-note').textContent")
        csv = page.evaluate(f"{LOSS}.txChart.csv()").splitlines()
        assert csv[0] == '"step","loss per token raw","loss per token","(forward) raw","(forward)"' and len(csv) == 1 + 6  # steps 1-5 and the forward at 6
        assert page.evaluate(f"{LOSS}.txChart.png()").startswith("data:image/png;base64,")
        page.click(".chart[data-title=\"loss per token\"] button.csv")  # a data: download, nothing off the host

        # hover: the legend reads out the step under the cursor; drag: zoom into steps 1-3
        box = page.evaluate(f"(() => {{ const r = {LOSS}.txChart.u.over.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; }})()")
        left, top, width, height = box
        mouse(page, "mouseMoved", left + width * 0.5, top + height * 0.5)
        readout = f"{LOSS}.querySelector('.u-legend .u-series .u-value').textContent"
        page.wait_for(f"!['--', '–', ''].includes({readout})", what="the cursor's readout")
        mouse(page, "mousePressed", left + width * 0.1, top + height * 0.5, button="left", buttons=1, clickCount=1)
        mouse(page, "mouseMoved", left + width * 0.6, top + height * 0.5, button="left", buttons=1)
        mouse(page, "mouseReleased", left + width * 0.6, top + height * 0.5, button="left", buttons=0, clickCount=1)
        zoomed = page.wait_for(f"(() => {{ const x = {LOSS}.txChart.u.scales.x; return x.max - x.min < 3.5 && [x.min, x.max]; }})()",
                               what="the drag to zoom in")
        mouse(page, "mouseMoved", left + width * 0.5, top + height * 0.5)
        # a live update (more steps land): the zoom and the readout stay
        seed_calls(console_server, run, [("forward_backward", 0.1), ("optim_step", 0.0)])
        page.wait_for("Number(document.querySelector('.chart[data-title=\"loss per token\"]').dataset.points) === 7",
                      what="the new step drawn")
        assert page.evaluate(f"(() => {{ const x = {LOSS}.txChart.u.scales.x; return [x.min, x.max]; }})()") == zoomed
        where = f"(() => {{ const r = {LOSS}.txChart.u.over.getBoundingClientRect(); return [r.left, r.top, scrollY]; }})()"
        assert page.evaluate(readout) not in ("--", "–", ""), (box, page.evaluate(where))  # the plot moved from under the pointer?
        page.screenshot(shots / "run-zoomed.png")
        # a step landing inside a zoomed window (panned past the last step) is drawn there: y takes it in
        page.evaluate(f"(() => {{ const c = {LOSS}.txChart; c.zoomed = true; c.u.setScale('x', {{ min: 5, max: 12 }}); }})()")
        seed_calls(console_server, run, [("forward_backward", 5.0), ("optim_step", 0.0)])
        page.wait_for(f"{LOSS}.txChart.u.scales.y.max >= 5", what="the step inside the zoom drawn")
        assert page.evaluate(f"(() => {{ const x = {LOSS}.txChart.u.scales.x; return [x.min, x.max]; }})()") == [5, 12]
        # double-click: every step again
        mouse(page, "mousePressed", left + width * 0.5, top + height * 0.5, button="left", buttons=1, clickCount=2)
        mouse(page, "mouseReleased", left + width * 0.5, top + height * 0.5, button="left", buttons=0, clickCount=2)
        page.wait_for(f"{LOSS}.txChart.u.scales.x.max - {LOSS}.txChart.u.scales.x.min >= 5", what="the zoom reset")


def test_the_runs_list_searches_filters_sorts_and_counts_right(page: Page, console_server: TxServer) -> None:
    with console_server.client(ALICE) as alice:
        alice.create_lora_training_client("tiny-qwen3", rank=4).result()  # a second run to sort by
        fresh = alice.create_lora_training_client("tiny-qwen3", rank=4).result()
        saved = fresh.save_weights_for_sampler("on-its-page").result().path
        run = fresh.model_id
        sign_in(page, console_server, ALICE)
        row = f"#runs tr[data-run=\"{run}\"]"
        page.wait_for(f"document.querySelector('{row}')")
        # created and never trained: idle with 0 steps, not "training"
        assert page.evaluate(f"document.querySelector('{row} .state').textContent") == "idle"
        assert page.evaluate(f"document.querySelector('{row} .steps').textContent") == "0"
        page.fill("#run-search", run)
        page.wait_for("document.querySelectorAll('#runs tbody tr').length === 1")
        assert page.evaluate("document.querySelector('#runs tbody tr').dataset.run") == run
        page.fill("#run-search", "no-such-run-anywhere")
        page.wait_for("document.querySelector('#runs tbody').textContent.includes('No run matches')")
        page.fill("#run-search", "")
        page.fill("#run-state", "corrupted")
        page.wait_for("document.querySelector('#runs tbody').textContent.includes('No run matches')")
        page.fill("#run-state", "")
        page.fill("#run-sort", "run_id:asc")
        ids = page.evaluate("[...document.querySelectorAll('#runs tbody tr')].map((r) => r.dataset.run)")
        assert ids == sorted(ids) and len(ids) > 1
        total = page.evaluate("document.querySelector('#runs-total').textContent")
        assert total.endswith(" runs") and not total.startswith("1 ")
        page.goto(f"{console_server.url}/console#/runs/{run}")
        page.wait_for(f"document.querySelector('#run-checkpoints tr[data-path=\"{saved}\"]')", what="the run's checkpoint on its page")
        assert page.evaluate("document.querySelector('#run-steps').textContent") == "0 steps"


def test_a_dead_server_is_shown_and_the_page_comes_back_with_it(
        browser: Browser, tmp_path_factory: pytest.TempPathFactory, shots: Path) -> None:
    server = TxServer(tmp_path_factory.mktemp("tx-dying"), args=["--api-key", ALICE])
    page = browser.page()
    with server:
        with server.client(ALICE) as alice:
            run = alice.create_lora_training_client("tiny-qwen3", rank=4).result().model_id
        sign_in(page, server, ALICE)
        page.goto(f"{server.url}/console#/runs/{run}")
        page.wait_for("document.body.dataset.ready === 'runs' && document.querySelector('#run-info')")
        server.stop()
        page.wait_for("!document.querySelector('#banner').hidden && document.body.classList.contains('stale')",
                      what="the banner after the server stopped")
        banner = page.evaluate("document.querySelector('#banner').textContent")
        assert banner.startswith("Server unreachable since ") and "retrying" in banner, banner
        page.screenshot(shots / "server-unreachable.png")
        page.goto(f"{server.url}/console#/checkpoints")  # a page that cannot load: said so, and tried again
        page.wait_for("document.querySelector('#retrying')", what="a retry offered")
        server.start()
        page.wait_for("document.body.dataset.ready === 'checkpoints' && document.querySelector('#checkpoints') && "
                      "document.querySelector('#banner').hidden && !document.body.classList.contains('stale')",
                      timeout_s=60, what="the page loaded once the server came back")
        assert [url for url in page.requests if not url.startswith((server.url, "data:", "about:"))] == []
        assert page.errors == [], page.errors
    page.close()


def test_the_playground_says_audio_prompts_need_the_sdk(page: Page, console_server: TxServer, shots: Path) -> None:
    """Issue 40 item 6: the playground sends text, a chat or token ids only; an audio (or image) prompt takes
    chunks the SDK encodes on the client (docs/cookbook.md#audio-recipes), and the page says so plainly."""
    sign_in(page, console_server, ALICE)
    page.goto(f"{console_server.url}/console#/playground")
    page.wait_for("document.body.dataset.ready === 'playground'", what="the playground")
    note = page.evaluate("(document.querySelector('#playground-media') || {}).textContent || ''")
    assert "audio" in note and "need the SDK" in note, note
    assert page.evaluate("!!document.querySelector('#playground-media').offsetParent"), "the note is not shown"
    assert not page.evaluate("!!document.querySelector('.playground input[type=file]')"), "a file input it cannot send"
    page.screenshot(shots / "playground-audio.png")


def test_a_base_model_loading_into_memory_is_shown_under_the_header(page: Page, console_server: TxServer) -> None:
    """What /api/v1/healthz's `loading` says (tests/unit/models/test_loading_progress.py: the server's side) is
    shown while it lasts. A real load of a tiny model is over in 0.1 s, between two of the page's asks, so the
    page's fetch of /healthz is answered by a stand-in here (named as such): one load at 41%, then none."""
    sign_in(page, console_server, ALICE)
    assert page.evaluate("document.querySelector('#loading').hidden")  # nothing loading: no line
    page.evaluate("""(() => { const real = window.fetch; window.txRealFetch = real;
        window.fetch = (url, init) => String(url).endsWith('/api/v1/healthz')
          ? Promise.resolve(new Response(JSON.stringify({ status: 'ok', loading: [
              { model: 'Qwen/Qwen3-8B', fraction: 0.41, seconds: 12.3 }] }), { status: 200 }))
          : real(url, init); })()""")
    line = page.wait_for("!document.querySelector('#loading').hidden && document.querySelector('#loading').textContent",
                         timeout_s=10, what="the loading line")
    assert line == "Loading Qwen/Qwen3-8B into memory: 41% of its weights (12 s)", line
    page.evaluate("window.fetch = window.txRealFetch")  # the real server: nothing loading
    page.wait_for("document.querySelector('#loading').hidden", timeout_s=10, what="the line gone once loaded")
    assert page.errors == [], page.errors


@pytest.mark.parametrize("width", [1400, 800, 390])
def test_every_page_fits_its_width(page: Page, console_server: TxServer, shots: Path, width: int) -> None:
    with console_server.client(ALICE) as alice:
        training = alice.create_lora_training_client("tiny-qwen3", rank=4).result()
        training.forward_backward([sft_datum(list(range(10, 30)))], "cross_entropy").result()
        training.save_weights_for_sampler("narrow").result()
        run, session = training.model_id, alice.holder._session_id
        page.send("Emulation.setDeviceMetricsOverride", width=width, height=900, deviceScaleFactor=1, mobile=False)
        sign_in(page, console_server, OPERATOR)
        pages = {"runs": ("#/runs", "#runs tbody tr"), "run": (f"#/runs/{run}", "#charts .chart"),
                 "checkpoints": ("#/checkpoints", "#checkpoints tbody tr"), "sessions": ("#/sessions", "#sessions tbody tr"),
                 "session": (f"#/sessions/{session}", "#timeline text.lane"), "engines": ("#/engines", "#usage tbody tr"),
                 "playground": ("#/playground", "#sample")}
        for name, (hash_, selector) in pages.items():
            page.goto(f"{console_server.url}/console{hash_}")
            page.wait_for(f"document.body.dataset.ready && !!document.querySelector('{selector}')", what=name)
            time.sleep(0.2)  # charts size themselves to their boxes
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            wide = page.evaluate("[...document.querySelectorAll('body *')].filter((e) => e.getBoundingClientRect().right > window.innerWidth + 0.5)"
                                 ".slice(0, 5).map((e) => `${e.tagName}#${e.id}.${e.className} ${Math.round(e.getBoundingClientRect().right)}`)")
            assert overflow <= 0, f"{name} at {width} px scrolls sideways by {overflow} px: {wide}"
            page.screenshot(shots / f"{name}-{width}.png")
        page.goto(f"{console_server.url}/console#/sessions/{session}")
        page.wait_for("document.querySelector('#timeline text.lane')")
        assert page.evaluate("document.querySelector('#timeline text.lane').textContent").startswith("run ")


def test_small_points_an_empty_key_a_readable_refusal_and_lanes_in_number_order(
        page: Page, console_server: TxServer) -> None:
    page.goto(f"{console_server.url}/console#/runs")
    page.wait_for("document.querySelector('#api-key') || document.body.dataset.ready === 'runs'")
    if page.evaluate("!!document.querySelector('#sign-out')"):
        page.click("#sign-out")
    page.wait_for("!!document.querySelector('#api-key')")
    page.fill("#api-key", "   ")
    page.click("#signin button[type=submit]")
    page.wait_for("document.querySelector('#signin-error').textContent.includes('Enter an API key')", what="the empty key refused")
    sign_in(page, console_server, ALICE)
    page.goto(f"{console_server.url}/console#/playground")
    page.wait_for("document.body.dataset.ready === 'playground'")
    page.fill("#max-tokens", "0")
    page.click("#sample")
    error = page.wait_for("document.querySelector('#playground-error').textContent", what="the refusal")
    assert error.startswith("422: max_tokens: ") and "{" not in error, error  # field: message, not raw JSON
    order = page.evaluate("(async () => { const m = await import(document.querySelector('script[type=module]').src.replace('app.js', 'sessions.js'));"
                          " const t = ['s:sample:10', 'oai', 's:sample:2', 's:train:1', 's:train:0'].sort(m.laneOrder);"
                          " return t.map((x) => m.lane(x).label); })()")
    assert order == ["run 0", "run 1", "sampler 2", "sampler 10", "OpenAI-compatible"]


EXITING_CLIENT = """
import sys, tinker
client = tinker.ServiceClient(base_url=sys.argv[1], api_key=sys.argv[2])
client.create_lora_training_client("tiny-qwen3", rank=4).result()
print(client.holder._session_id, flush=True)
"""  # a script that ends without closing its session, as most do


def console_session(server: TxServer, key: str, session_id: str) -> dict:
    answer = httpx.get(f"{server.url}/api/v1/console/sessions/{session_id}", headers={"X-API-Key": key}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["session"]


def test_a_session_whose_sdk_client_exited_stops_being_shown_active(console_server: TxServer) -> None:
    """The SDK heartbeats every 10 s while its client lives; three missed heartbeats and the console shows the
    session idle, saying why (it stayed "active" until the janitor finished it, 15 min later)."""
    done = subprocess.run([sys.executable, "-c", EXITING_CLIENT, console_server.url, ALICE], capture_output=True,
                          text=True, timeout=180, stdin=subprocess.DEVNULL, env={**os.environ, "TINKER_TELEMETRY": "0"},
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    session_id = done.stdout.split()[-1]
    assert console_session(console_server, ALICE, session_id)["status"] == "active"
    deadline = time.monotonic() + 60
    while (shown := console_session(console_server, ALICE, session_id))["status"] == "active":
        assert time.monotonic() < deadline, f"still active 60 s after its client exited: {shown}"
        time.sleep(2)
    assert shown["status"] == "idle" and "no heartbeat for" in shown["reason"], shown
    assert time.monotonic() > deadline - 60 + 15  # not before a few heartbeats were missed


def run_metrics(server: TxServer, key: str, run_id: str) -> RunMetrics:
    answer = httpx.get(f"{server.url}/api/v1/console/runs/{run_id}/metrics", headers={"X-API-Key": key}, timeout=30)
    assert answer.status_code == 200, answer.text
    return RunMetrics.model_validate_json(answer.content)


def test_a_run_pages_kept_metrics_give_way_to_a_new_step_and_to_thinning(console_server: TxServer) -> None:
    """A whole read is kept written (issue 41: a reload of 20,000 calls answers from memory) while the run records
    nothing new: a recorded call, or thinning, makes the next read a fresh one, whichever process wrote them."""
    from tx.store.store import Store

    with console_server.client(ALICE) as alice:
        run = alice.create_lora_training_client("tiny-qwen3", rank=4).result().model_id
    seed_steps(console_server, run, 50)  # written by another process than the server, as a second recorder would
    first = run_metrics(console_server, ALICE, run)
    assert (len(first.calls.seq), first.last_seq, first.run.steps, first.calls.seconds[0]) == (100, 100, 50, 0.05)
    db = console_server.data_dir / "tx.db"
    with sqlite3.connect(db) as conn:  # a row changed behind tx's back (tx never changes one): the kept read hides it
        conn.execute("UPDATE run_metrics SET seconds = 9.5 WHERE run_id = ? AND seq = 1", (run,))
    kept = run_metrics(console_server, ALICE, run)
    assert kept.calls == first.calls and kept.calls.seconds[0] == 0.05
    seed_steps(console_server, run, 1)
    grown = run_metrics(console_server, ALICE, run)
    assert (len(grown.calls.seq), grown.last_seq, grown.run.steps, grown.calls.step[-1]) == (102, 102, 51, 51)
    assert grown.calls.seconds[0] == 9.5  # read again, not kept
    store = Store.from_url(f"sqlite:///{db}")
    try:
        dropped = store.metrics.thin(run)
    finally:
        store.close()
    thinned = run_metrics(console_server, ALICE, run)
    assert dropped > 0 and len(thinned.calls.seq) == 102 - dropped and thinned.last_seq == 102
    with sqlite3.connect(db) as conn:
        kept_seqs = [seq for (seq,) in conn.execute("SELECT seq FROM run_metrics WHERE run_id = ? ORDER BY seq",
                                                    (run,))]
    assert thinned.calls.seq == kept_seqs
    other = httpx.get(f"{console_server.url}/api/v1/console/runs/{run}/metrics", headers={"X-API-Key": BOB}, timeout=30)
    assert other.status_code == 404, other.text  # a kept answer is no answer to another tenant


def console_me(server: TxServer, key: str) -> dict:
    answer = httpx.get(f"{server.url}/api/v1/console/me", headers={"X-API-Key": key}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_an_operator_sees_keys_by_their_labels_and_a_tenant_sees_only_its_own(
        page: Page, console_server: TxServer, shots: Path) -> None:
    with console_server.client(BOB) as bob:
        run = bob.create_lora_training_client("tiny-qwen3", rank=4).result().model_id
        session = bob.holder._session_id
        sign_in(page, console_server, OPERATOR)
        cell = f"#runs tr[data-run=\"{run}\"] td.owner"
        page.wait_for(f"document.querySelector('{cell}')", what="bob's run in the operator's list")
        assert page.evaluate(f"document.querySelector('{cell}').textContent") == BOB_LABEL  # was the owner id's start
        assert page.evaluate(f"document.querySelector('{cell}').title") == owner_of(BOB)
        assert page.evaluate("document.querySelector('#who-key').textContent") == f"key {OPERATOR_LABEL}"
        page.goto(f"{console_server.url}/console#/sessions")
        page.wait_for(f"document.body.dataset.ready === 'sessions' && document.body.innerText.includes('{session}')")
        owners = page.evaluate(f"[...document.querySelectorAll('#sessions tr')].filter(r => r.innerText.includes('{session}'))"
                               ".map(r => r.querySelector('td.owner').textContent)")
        assert owners == [BOB_LABEL]
        page.screenshot(shots / "sessions-labelled.png")
    assert console_me(console_server, ALICE)["labels"] == {}  # a tenant reads no other key's label
    assert console_me(console_server, BOB)["labels"] == {owner_of(BOB): BOB_LABEL}  # its own
    assert len(console_me(console_server, OPERATOR)["labels"]) == 2


def test_checkpoints_bulk_delete_confirms_the_count_and_shows_each_failure_on_its_row(
        page: Page, console_server: TxServer, shots: Path) -> None:
    with console_server.client(ALICE) as alice:
        training = alice.create_lora_training_client("tiny-qwen3", rank=4).result()
        paths = [training.save_weights_for_sampler(f"bulk-{i}").result().path for i in range(4)]
        doomed, kept = paths[:3], paths[3]
        rest = tinker.RestClient(base_url=console_server.url, api_key=ALICE)
        sign_in(page, console_server, ALICE)
        page.goto(f"{console_server.url}/console#/checkpoints")
        row = lambda path: f"#checkpoints tr[data-path=\"{path}\"]"
        page.wait_for(f"document.body.dataset.ready === 'checkpoints' && document.querySelector('{row(kept)}')")
        for path in doomed:
            page.click(f"{row(path)} input.pick")
        rest.delete_checkpoint_from_tinker_path(doomed[1]).result()  # gone behind the page's back: its delete fails
        page.click("#delete-selected")
        assert page.evaluate("document.querySelector('#delete-selected').textContent") == "Really delete 3 checkpoints?"
        assert all(page.evaluate(f"!!document.querySelector('{row(path)}')") for path in paths)  # nothing yet
        page.screenshot(shots / "checkpoints-bulk-confirm.png")
        page.click("#delete-selected")
        page.wait_for(f"!document.querySelector('{row(doomed[0])}') && !document.querySelector('{row(doomed[2])}')",
                      what="the deleted rows taken off")
        error = page.wait_for(f"document.querySelector('{row(doomed[1])} .row-error')?.textContent")
        assert error.startswith("not deleted: 404"), error
        assert page.evaluate("document.querySelector('#checkpoint-error').textContent").startswith("1 checkpoint not deleted")
        assert page.evaluate(f"document.querySelector('{row(doomed[1])} input.pick').checked")  # ticked, to retry
        page.screenshot(shots / "checkpoints-bulk-failed.png")
        listed = {c.tinker_path for c in rest.list_checkpoints(training.model_id).result().checkpoints}
        assert listed & set(paths) == {kept}  # the three gone for real, the unticked one kept
        sign_in(page, console_server, OPERATOR)  # another key's rows have nothing to tick
        page.goto(f"{console_server.url}/console#/checkpoints")
        page.wait_for(f"document.body.dataset.ready === 'checkpoints' && document.querySelector('{row(kept)}')")
        assert not page.evaluate(f"!!document.querySelector('{row(kept)} input.pick')")


def test_runs_show_their_names_and_tags_search_and_filter_by_them_and_the_owner_edits_them(
        page: Page, console_server: TxServer, shots: Path) -> None:
    """Issue 41: a run named and tagged from the SDK's user_metadata is listed by its name (an unnamed one by its
    id), found by name or tag, filtered by tag; its page edits both, and shows the server's refusal as said."""
    with console_server.client(ALICE) as alice:
        named = alice.create_lora_training_client("tiny-qwen3", rank=4, user_metadata={
            "name": "sweep lr 3e-4", "tags": "sweep,tiny"}).result().model_id
        plain = alice.create_lora_training_client("tiny-qwen3", rank=4).result().model_id
        sign_in(page, console_server, ALICE)
        row = f"#runs tr[data-run=\"{named}\"]"
        page.wait_for(f"document.querySelector('{row}')")
        assert page.evaluate(f"document.querySelector('{row} .run-name').textContent") == "sweep lr 3e-4"
        assert page.evaluate(f"[...document.querySelectorAll('{row} .pill.tag')].map((p) => p.textContent)") == [
            "sweep", "tiny"]
        plain_row = f"#runs tr[data-run=\"{plain}\"]"
        assert page.evaluate(f"document.querySelector('{plain_row} .run-name').textContent") == plain
        page.fill("#run-search", "lr 3e-4")
        page.wait_for(f"document.querySelectorAll('#runs tbody tr').length === 1 && !!document.querySelector('{row}')")
        page.fill("#run-search", "")
        page.fill("#run-tag", "sweep")
        page.wait_for(f"!!document.querySelector('{row}') && !document.querySelector('{plain_row}')",
                      what="the tag filter keeping only the tagged run")
        page.screenshot(shots / "runs-named-and-tagged.png")
        page.fill("#run-tag", "")

        page.goto(f"{console_server.url}/console#/runs/{named}")
        page.wait_for("document.querySelector('#run-title') && document.querySelector('#run-name')")
        assert page.evaluate("document.querySelector('#run-title').textContent") == "sweep lr 3e-4"
        page.evaluate("document.querySelector('#run-name').value = 'x'.repeat(121)")  # past its maxlength
        page.click("#run-labels-save")
        page.wait_for("document.querySelector('#run-labels-status').textContent.includes('at most 120 characters')",
                      what="the server's refusal of a 121-character name")
        page.evaluate("document.querySelector('#run-name').value = 'best so far'")
        page.evaluate("document.querySelector('#run-tags').value = 'keep, sweep'")
        page.click("#run-labels-save")
        page.wait_for("document.querySelector('#run-title').textContent === 'best so far'", what="the new name")
        assert page.evaluate("document.querySelector('#run-labels-status').textContent") == "saved"
        listed = httpx.get(f"{console_server.url}/api/v1/console/runs", headers={"X-API-Key": ALICE}, timeout=30)
        mine = next(r for r in listed.json()["runs"] if r["run_id"] == named)
        assert (mine["name"], mine["tags"]) == ("best so far", ["keep", "sweep"])
        page.screenshot(shots / "run-labels.png")

        sign_in(page, console_server, OPERATOR)  # an operator sees the run, and no editor for it
        page.goto(f"{console_server.url}/console#/runs/{named}")
        page.wait_for("document.querySelector('#run-title')")
        assert page.evaluate("document.querySelector('#run-name') === null")
