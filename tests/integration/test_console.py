"""The web console in a real headless Chromium (tests/browser.py) against a live `tx serve` with three keys:
alice and bob (tenants) and an operator key. A run trains through the SDK while the browser watches.

Screenshots of each page go to $TX_CONSOLE_SHOTS (default: the test's temporary directory)."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
from browser import Browser, Page, chromium_path
from sdk_datums import sft_datum
from tinker import types
from txserver import API_KEY, TxServer

ALICE, BOB, OPERATOR = API_KEY, "tml-bob-key", "tml-operator-key"
LOAD_BUDGET_MS = 300


@pytest.fixture(scope="module")
def console_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    args = ["--api-key", ALICE, "--api-key", BOB, "--api-key", OPERATOR, "--operator-key", OPERATOR]
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
            samples = []
            for _ in range(6):  # a fresh page load each time; the first fills the browser's cache
                page.goto("about:blank")
                page.goto(f"{console_server.url}/console{hash_}")
                page.wait_for("document.body.dataset.ready && window.txReadyMs !== undefined", what=f"{name} to load")
                samples.append(float(page.evaluate("window.txReadyMs")))
            best[name], median[name] = min(samples[1:]), statistics.median(samples[1:])
            if name == "run":
                assert chart_points(page, "loss per token") == 1000
                page.screenshot(shots / "run-1000-steps.png")
        print(f"console page load, navigation start to data drawn, ms (5 warm loads; load average "
              f"{os.getloadavg()[0]:.1f}): best {_rounded(best)}, median {_rounded(median)}")
        # The best of five, against 300 ms on a quiet box. On a box running more than one runnable process per
        # core (others' test runs), every load waits its turn for a core: the budget grows by that factor, so
        # the test measures the console rather than the neighbours (CI runs alone: the plain 300 ms).
        budget = LOAD_BUDGET_MS * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
        assert max(best.values()) < budget, (best, budget)


def _rounded(timings: dict[str, float]) -> dict[str, float]:
    return {k: round(v) for k, v in timings.items()}
