"""Every refusal at start is one line naming the cause and the fix, with exit status 2 and no traceback (unless
--debug): `tx serve`, `tx engine serve`, `tx models make-tiny` and `tx checkpoints export`, run as a user runs
them. The gated model is served by a STAND-IN hub on 127.0.0.1 (tests/hub_standin.py; the real hub is not
reachable from CI)."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_standin import HubStandIn

from tx.models.tiny import write_tiny_text_model
from tx.store.migrate import upgrade_to_head
from tx.store.store import make_engine


def tx(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TX_"))}
    return subprocess.run([sys.executable, "-P", "-m", "tx.cli", *args], env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout_s, check=False)


def refused(result: subprocess.CompletedProcess, command: str) -> str:
    """The one line of a refusal: exit status 2, no traceback, the last line of stderr, the only one that names
    the command (the lines before it are the log's)."""
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert [line for line in lines if line.startswith(f"{command}: ")] == lines[-1:], result.stderr[-3000:]
    return lines[-1]


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something already listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_a_missing_model_offline(tmp_path: Path) -> None:
    hub = tmp_path / "hf" / "hub"
    result = tx("serve", "--port", "0", "--data-dir", str(tmp_path / "tx"), "--base-model", "Org/Missing", "--offline",
                env={"HF_HOME": str(tmp_path / "hf")})
    assert refused(result, "tx serve") == (
        f"tx serve: model 'Org/Missing' is not in the Hugging Face cache at {hub} and tx is offline (--offline or "
        "HF_HUB_OFFLINE=1): drop that to download it, set HF_HOME or HF_HUB_CACHE to the cache that holds it, or "
        "write a tiny stand-in there with: tx models make-tiny Org/Missing")


def test_a_gated_model_without_a_token(tmp_path: Path) -> None:
    model = write_tiny_text_model(tmp_path / "model", preset="tiny")
    with HubStandIn() as hub:
        hub.add("Org/Gated", model, token="hf_standin_token")
        result = tx("serve", "--port", "0", "--data-dir", str(tmp_path / "tx"), "--base-model", "Org/Gated",
                    env={"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": hub.url})
    assert refused(result, "tx serve") == (
        f"tx serve: model 'Org/Gated' is gated on {hub.url}/Org/Gated: accept its terms on its page, then set "
        "HF_TOKEN to a token of that account (https://huggingface.co/settings/tokens)")


def test_a_bad_flag_combination(tmp_path: Path) -> None:
    result = tx("serve", "--data-dir", str(tmp_path / "tx"), "--engine-count", "-1")
    assert refused(result, "tx serve") == (
        "tx serve: invalid settings: --engine-count: Input should be greater than or equal to 0")
    result = tx("serve", "--data-dir", str(tmp_path / "tx"), "--trainer-node-label", "zone=a")
    assert refused(result, "tx serve") == (
        "tx serve: invalid settings: trainer_node_labels places trainer workers: set --trainer-workers 2 or more "
        "(with 1 the trainer runs inside the server process)")


def test_a_port_in_use(tmp_path: Path, listening: int) -> None:
    result = tx("serve", "--port", str(listening), "--data-dir", str(tmp_path / "tx"))
    message = (f"tx serve: port {listening} on 127.0.0.1 is in use (another tx serve?): stop what holds it, or "
               "choose another with --port (0 picks a free one)")
    assert refused(result, "tx serve") == message
    debug = tx("serve", "--port", str(listening), "--data-dir", str(tmp_path / "tx"), "--debug")
    assert debug.returncode == 2 and "Traceback" in debug.stderr and debug.stderr.strip().endswith(message)


def test_an_unwritable_data_directory(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    data_dir = tmp_path / "a-file" / "tx"  # under a file: no user can write there, root included
    result = tx("serve", "--port", "0", "--data-dir", str(data_dir))
    assert refused(result, "tx serve") == (
        f"tx serve: cannot use the data directory {data_dir} (Not a directory): choose another with --data-dir "
        "(or TX_DATA_DIR), or make it writable by this user")


def test_a_store_written_by_a_newer_tx(tmp_path: Path) -> None:
    data_dir = tmp_path / "tx"
    data_dir.mkdir()
    head = upgrade_to_head(make_engine(f"sqlite:///{data_dir / 'tx.db'}"))
    with sqlite3.connect(data_dir / "tx.db") as db:
        db.execute("UPDATE alembic_version SET version_num = '9999_from_the_future'")
    result = tx("serve", "--port", "0", "--data-dir", str(data_dir))
    assert refused(result, "tx serve") == (
        f"tx serve: the store is at schema revision 9999_from_the_future, which this tx does not know (its newest is "
        f"{head}): a newer tx wrote it; upgrade tx, or start with another --data-dir or --database-url")


def test_engine_serve_refusals(tmp_path: Path, listening: int) -> None:
    secret = {"TX_ENGINE_SECRET": "s" * 32, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    result = tx("engine", "serve", "--model", "Org/Missing", "--port", "0", env=secret)
    assert refused(result, "tx engine serve").startswith(
        "tx engine serve: model 'Org/Missing' is not in the Hugging Face cache at ")
    result = tx("engine", "serve", "--model", "Org/Missing", "--port", str(listening), env=secret)
    assert refused(result, "tx engine serve") == (
        f"tx engine serve: port {listening} on 127.0.0.1 is in use (another tx serve?): stop what holds it, or "
        "choose another with --port (0 picks a free one)")


def test_make_tiny_refusals(tmp_path: Path) -> None:
    result = tx("models", "make-tiny", "not-a-hub-id", "--hf-home", str(tmp_path / "hf"))
    assert refused(result, "tx models make-tiny").startswith(
        "tx models make-tiny: no tiny model family is known for 'not-a-hub-id'; pass one with --preset")
    (tmp_path / "a-file").write_text("")
    result = tx("models", "make-tiny", "Qwen/Qwen3-8B", "--hf-home", str(tmp_path / "a-file" / "hf"))
    snapshots = tmp_path / "a-file" / "hf" / "hub" / "models--Qwen--Qwen3-8B" / "snapshots"
    assert refused(result, "tx models make-tiny") == (
        f"tx models make-tiny: cannot write {snapshots} (Not a directory): choose another place with --hf-home "
        "(or HF_HOME) or --out")


def test_checkpoint_export_refusals(tmp_path: Path) -> None:
    result = tx("checkpoints", "export", "tinker://run-1/weights/none", "--merge", str(tmp_path / "out"),
                "--data-dir", str(tmp_path / "tx"))
    assert refused(result, "tx checkpoints export") == (
        "tx checkpoints export: checkpoint tinker://run-1/weights/none has no files on this server")
    result = tx("checkpoints", "export", str(tmp_path / "nowhere"), "--merge", str(tmp_path / "out"))
    assert refused(result, "tx checkpoints export") == (
        f"tx checkpoints export: {tmp_path / 'nowhere'} is not a readable training-state checkpoint ([Errno 2] No "
        f"such file or directory: '{tmp_path / 'nowhere' / 'tx_state.json'}')")


def test_a_refusal_inside_the_server_start_is_one_line_too(tmp_path: Path) -> None:
    """What the lifespan refuses (here: an external engine that does not answer) ends the same way."""
    result = tx("serve", "--port", "0", "--data-dir", str(tmp_path / "tx"), "--engine-url", "http://127.0.0.1:9",
                env={"TX_ENGINE_SECRET": "s" * 32})
    assert refused(result, "tx serve") == (
        "tx serve: external engines failed their startup checks: engine http://127.0.0.1:9 is unreachable "
        "(ConnectError: All connection attempts failed)")
