"""The test helper tests/txserver.py: a `tx serve` whose start is interrupted is not left running."""

from pathlib import Path

import pytest
import txserver


def test_a_start_interrupted_by_ctrl_c_stops_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*_args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(txserver, "wait_healthy", interrupted)
    server = txserver.TxServer(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert server.proc is not None and server.proc.poll() is not None
