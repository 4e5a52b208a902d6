"""An attached vLLM (`tx engine serve --kind vllm --vllm-url`): reached over a Unix socket in a private directory,
never a TCP port. The shared-server probe's finding 9: the recipe started vLLM in dev mode on a TCP port with no
key, so any local user could reach tx's worker extension (vLLM's --api-key does not cover its dev-mode routes)."""

from __future__ import annotations

import http.server
import os
import socketserver
import threading
from pathlib import Path

import pydantic
import pytest

from tx.inference.engines.standalone import StandaloneEngine, vllm_serve_command
from tx.inference.engines.vllm.child import VllmChild, check_private_socket
from tx.inference.engines.vllm.config import VllmEngineConfig


def test_the_recipe_serves_vllm_on_a_unix_socket_only(tiny_model_dir: Path, tmp_path: Path) -> None:
    socket = tmp_path / "private" / "vllm.sock"
    lines = vllm_serve_command(StandaloneEngine(kind="vllm", model=str(tiny_model_dir), max_adapters=12,
                                                max_lora_rank=64, vllm_url=f"unix://{socket}")).splitlines()
    assert lines[0] == f"mkdir -p -m 700 {socket.parent}"
    vllm = lines[1].split()
    assert vllm[vllm.index("--uds") + 1] == str(socket) and "--host" not in vllm and "--port" not in vllm
    assert vllm[vllm.index("--max-lora-rank") + 1] == "64" and vllm[vllm.index("--max-cpu-loras") + 1] == "12"
    assert f"--vllm-url unix://{socket}" in lines[2] and lines[2].startswith("TX_ENGINE_SECRET=")
    assert "--max-adapters 12 --max-lora-rank 64" in lines[2], "tx's engine knows the limits vLLM starts with"


def test_a_tcp_url_is_refused_saying_why(tiny_model_dir: Path) -> None:
    with pytest.raises(pydantic.ValidationError, match="--api-key does not cover"):
        VllmEngineConfig(model_dir=tiny_model_dir, cluster_secret="s" * 16, vllm_url="http://127.0.0.1:8000")


def test_a_socket_directory_others_may_enter_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    with pytest.raises(RuntimeError, match="not private to this user"):
        check_private_socket(directory / "vllm.sock")
    os.chmod(directory, 0o700)
    check_private_socket(directory / "vllm.sock")


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def address_string(self) -> str:  # a Unix peer has no host
        return "unix"

    def log_message(self, *args: object) -> None:
        pass


def test_the_engine_talks_to_the_attached_vllm_over_its_socket(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A stand-in for vLLM (an HTTP server on the socket: vLLM itself is tests/vllm_engine's)."""
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    socket = directory / "vllm.sock"
    server = socketserver.UnixStreamServer(str(socket), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = VllmEngineConfig(model_dir=tiny_model_dir, cluster_secret="s" * 16, vllm_url=f"unix://{socket}")
        child = VllmChild(config, tmp_path, "tx-base", sleep_mode=False)
        child.start()  # attached: starts nothing, checks the directory
        child.wait_healthy(10)
    finally:
        server.shutdown()
        server.server_close()
