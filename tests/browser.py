"""A real headless Chromium (Debian's `chromium`), driven over the DevTools protocol (CDP) on a websocket: for
the console's browser tests. Few moving parts: the browser and `websockets`, no driver binary.

`Browser.start(dir)` launches it with a fresh profile; `browser.page()` opens a tab (a `Page`) that records
what the page asked the network for, and every script error, so tests can check both.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Self

import httpx
from websockets.sync.client import ClientConnection, connect

from txserver import free_port, stop_group

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc, self.port = proc, port

    @classmethod
    def start(cls, work_dir: Path, timeout_s: float = 30.0) -> Self:
        executable = chromium_path()
        assert executable, "chromium is not installed (apt-get install chromium; .ci/run does it)"
        port = free_port()
        profile = work_dir / "chromium-profile"
        profile.mkdir(parents=True, exist_ok=True)
        log = open(work_dir / "chromium.log", "ab")
        proc = subprocess.Popen([executable, *FLAGS, f"--user-data-dir={profile}", f"--remote-debugging-port={port}",
                                 "about:blank"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {proc.returncode}: {(work_dir / 'chromium.log').read_text()[-2000:]}")
            try:
                httpx.get(f"http://127.0.0.1:{port}/json/version", timeout=1).raise_for_status()
                return cls(proc, port)
            except httpx.HTTPError:
                time.sleep(0.1)
        stop_group(proc, 5)
        raise TimeoutError("chromium's DevTools endpoint did not come up")

    def page(self, width: int = 1440, height: int = 900) -> Page:
        target = httpx.put(f"http://127.0.0.1:{self.port}/json/new?about:blank", timeout=10).json()
        page = Page(connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=10).__enter__())
        for domain in ("Page", "Runtime", "Network"):
            page.send(f"{domain}.enable")
        page.send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)
        return page

    def close(self) -> None:
        stop_group(self.proc, 5)


class Page:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self._id = 0
        self.requests: list[str] = []  # every URL the page asked for
        self.errors: list[str] = []  # uncaught exceptions and console.error calls

    def send(self, method: str, timeout_s: float = 30.0, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            message = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self._event(message)

    def _event(self, message: dict[str, Any]) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Network.requestWillBeSent":
            self.requests.append(params["request"]["url"])
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.errors.append(str(details.get("exception", {}).get("description") or details.get("text")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))

    def evaluate(self, expression: str, timeout_s: float = 30.0) -> Any:
        result = self.send("Runtime.evaluate", timeout_s=timeout_s, expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def reload(self) -> None:
        """Reload the page (F5) and return once the old document is gone; the new one may still be loading."""
        self.evaluate("window.txOldDocument = true")
        self.send("Page.reload")
        self.wait_for("window.txOldDocument === undefined", what="the reloaded document")

    def wait_for(self, expression: str, timeout_s: float = 30.0, what: str = "") -> Any:
        """Until `expression` is truthy in the page; its value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                value = self.evaluate(expression)
            except RuntimeError:
                value = None  # the page is navigating
            if value not in (None, False, 0, ""):  # an element comes back as {}: found
                return value
            time.sleep(0.05)
        body = self.evaluate("document.body ? document.body.innerText.slice(0, 2000) : ''")
        raise TimeoutError(f"waited {timeout_s} s for {what or expression}; the page shows:\n{body}")

    def click(self, selector: str) -> None:
        found = self.evaluate(f"(() => {{ const el = document.querySelector({json.dumps(selector)}); "
                              "if (!el) return false; el.scrollIntoView(); el.click(); return true; })()")
        assert found, f"nothing matches {selector!r}"

    def fill(self, selector: str, text: str) -> None:
        found = self.evaluate(f"(() => {{ const el = document.querySelector({json.dumps(selector)}); if (!el) return false; "
                              f"el.value = {json.dumps(text)}; el.dispatchEvent(new Event('input', {{bubbles: true}})); "
                              "el.dispatchEvent(new Event('change', {bubbles: true})); return true; })()")
        assert found, f"nothing matches {selector!r}"

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        self.ws.close()
