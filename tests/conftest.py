import gc
import os
import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).parent))
import background  # tests/ is on the path only from here on

os.environ.setdefault("TINKER_TELEMETRY", "0")
# engines run the self-check on every load in tests (a kept decision would hide it); its cache has its own test
os.environ["TX_SELFCHECK_CACHE"] = ""
LEFT_OPEN = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ~0.4M-parameter Qwen3 ("tiny" preset) with its Qwen-like tokenizer (tests/unit/backends has its own)."""
    from tx.models.tiny import write_tiny_text_model

    return write_tiny_text_model(tmp_path_factory.mktemp("tiny-model"), preset="tiny", seed=0)


@pytest.fixture(scope="session")
def family_model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random model of each family in `families.FAMILIES` (seed 0), by preset name."""
    from families import FAMILIES

    from tx.models import write_tiny_model

    root = tmp_path_factory.mktemp("families")
    return {preset: write_tiny_model(root / preset, preset=preset, seed=0) for preset in FAMILIES}


@pytest.fixture(scope="session")
def reference_model(tiny_model_dir: Path):
    """The same weights as a plain transformers model in this process: what engines' logprobs are checked
    against."""
    from reference_logprobs import load_reference

    return load_reference(tiny_model_dir)


def open_tinker_sessions() -> list[str]:
    """The tinker sessions of this process that still heartbeat: each was never closed (or its close never
    reached a server), so once its server is gone the SDK logs heartbeat failures until the process ends."""
    holder_class = getattr(sys.modules.get("tinker.lib.internal_client_holder"), "InternalClientHolder", None)
    if holder_class is None:
        return []
    # type(), not isinstance(): isinstance reads __class__, which raises ReferenceError on a dead weakref.proxy
    return [f"{holder._session_id} at {holder._base_url}" for holder in gc.get_objects()
            if issubclass(type(holder), holder_class)
            and holder._session_heartbeat_task is not None and not holder._session_heartbeat_task.done()]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the one-shot jobs the collected test modules declare (tests/background.py), niced, now."""
    background.start_for({item.module for item in session.items if isinstance(item, pytest.Function)})


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail a run that leaves tinker sessions open: close each ServiceClient while its server still runs
    (`with server.client() as client`), or `abandon` it once its server was killed (tests/txserver.py).
    Background jobs no test waited for are killed."""
    background.stop_all()
    session.config.stash[LEFT_OPEN] = open_tinker_sessions()
    if session.config.stash[LEFT_OPEN]:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    left_open = config.stash.get(LEFT_OPEN, [])
    if left_open:
        terminalreporter.section("tinker sessions left open", red=True)
        terminalreporter.line(f"{len(left_open)} session(s), whose heartbeats would fail (and warn) for the rest "
                              "of the run: " + ", ".join(left_open), red=True)
