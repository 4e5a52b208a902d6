"""The console's playground says plainly that audio prompts need the SDK (issue 40 item 6), in a real headless
Chromium (tests/browser.py) against a live `tx serve`: it sends text, a chat or token ids only, and an audio
model takes DMel chunks the client encodes (docs/cookbook.md#audio-recipes)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import Browser, chromium_path
from txserver import API_KEY, TxServer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    with TxServer(tmp_path_factory.mktemp("tx-console"), args=["--api-key", API_KEY]) as started:
        yield started


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    if chromium_path() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    started = Browser.start(tmp_path_factory.mktemp("chromium"))
    yield started
    started.close()


def test_the_playground_says_audio_prompts_need_the_sdk(browser: Browser, server: TxServer, tmp_path: Path) -> None:
    page = browser.page()
    try:
        page.goto(f"{server.url}/console#/playground")
        page.wait_for("document.querySelector('#api-key')", what="the sign-in form")
        page.fill("#api-key", API_KEY)
        page.click("#signin button[type=submit]")
        page.wait_for("document.body.dataset.ready === 'runs' || document.body.dataset.ready === 'playground'")
        page.goto(f"{server.url}/console#/playground")
        page.wait_for("document.body.dataset.ready === 'playground'", what="the playground")
        note = page.evaluate("(document.querySelector('#playground-media') || {}).textContent || ''")
        assert "audio" in note and "need the SDK" in note, note
        visible = page.evaluate("!!document.querySelector('#playground-media').offsetParent")
        assert visible, "the note is not shown"
        assert not page.evaluate("!!document.querySelector('.playground input[type=file]')"), "a file input it cannot send"
        page.screenshot(Path(os.environ.get("TX_CONSOLE_SHOTS") or tmp_path) / "playground-audio.png")
        assert page.errors == [], page.errors
    finally:
        page.close()
