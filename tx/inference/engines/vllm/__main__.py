"""`python -m tx.inference.engines.vllm`: one vLLM engine; config from TX_ENGINE_CONFIG(_FILE).

Checks the vLLM version (exit code 2 with a clear message if missing or unsupported), starts `vllm serve` as a
child on a private Unix socket, waits until it is healthy, then serves tx's routes on `host:port` and writes
the ready file. Exits (stopping vLLM) on SIGTERM, when vLLM dies, or when its parent goes away. Started as the
leader of its own process group (as tx's launchers start it), it also leaves a watcher in that group that ends
the group (vLLM's server, engine core, workers) once this process is gone, even if it was SIGKILLed (as Ray
does to an actor's children).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading
import time

from tx.inference.engines.app import engine_app
from tx.inference.engines.kinds import VLLM
from tx.inference.engines.serving import ReadyServer, bind
from tx.inference.engines.vllm import VllmUnavailable, require_vllm
from tx.inference.engines.vllm.child import VllmChild, private_dirs, sleep_mode_on
from tx.inference.engines.vllm.config import VllmEngineConfig
from tx.inference.engines.vllm.server import BASE_MODEL_NAME, VllmEngine
from tx.logging import init_logging

logger = logging.getLogger("tx.inference.engines.vllm")


def _watch(child: VllmChild, exit_with_parent: bool, cleanup) -> None:
    """Exit (stopping vLLM, then `cleanup()`) when vLLM dies or, if asked, when the parent process goes away."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            if child.process is not None and child.process.poll() is not None:
                logger.error("vLLM exited with code %s; exiting", child.process.returncode)
                break
            if exit_with_parent and os.getppid() != parent:
                logger.warning("parent process %d went away; stopping vLLM and exiting", parent)
                break
            time.sleep(1.0)
        child.stop(timeout_s=10)
        cleanup()
        os._exit(1)

    threading.Thread(target=watch, name="tx-vllm-watch", daemon=True).start()


def _end_group_when_gone(cleanup) -> None:
    """Fork a watcher that runs `cleanup()` (the private adapter and socket dirs) and SIGKILLs this process
    group (itself included) once this process exits, however it exits: it waits for EOF on a pipe whose only
    writer is this process. Only as a group leader."""
    if os.getpgid(0) != os.getpid():
        return
    read_fd, write_fd = os.pipe()  # not inherited by vLLM (close-on-exec)
    if os.fork() == 0:
        try:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(signum, signal.SIG_IGN)  # the group's SIGTERM is for the engine, not for this
            os.close(write_fd)
            while os.read(read_fd, 1):
                pass
            cleanup()
            os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(0)
    os.close(read_fd)  # `write_fd` stays open for as long as this process lives


def _exit_on_signal(signum, frame) -> None:
    raise SystemExit(128 + signum)  # runs the `finally` that stops vLLM


def main(config: VllmEngineConfig | None = None) -> None:
    """Serve one engine: `config`, or the one in the environment (as tx's launchers hand it over)."""
    config = config or VllmEngineConfig.from_env()
    init_logging(config.log_level)
    try:
        version = require_vllm(sys.executable)  # this process runs in the vLLM environment
    except VllmUnavailable as exc:
        print(f"tx vLLM engine: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    sock, url = bind(config.host, config.port)  # bound early: the port is ours while vLLM starts
    run_dir, lora_dir = private_dirs(config)

    def cleanup() -> None:
        shutil.rmtree(lora_dir, ignore_errors=True)
        if config.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_on_signal)
    _end_group_when_gone(cleanup)
    child = VllmChild(config, run_dir, BASE_MODEL_NAME, sleep_mode_on(config))
    child.start()
    try:
        _watch(child, config.exit_with_parent, cleanup)  # from the start: a parent may go while vLLM loads
        child.wait_healthy(config.startup_timeout_s)
        logger.info("vLLM %s healthy (sleep mode %s)", version, "on" if child.sleep_mode else "off")
        engine = VllmEngine(config, child, lora_dir)
        server = ReadyServer(engine_app(engine, f"tx {VLLM.label}"), config, url, VLLM.label)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: setattr(server, "should_exit", True))
        server.run(sockets=[sock])
    finally:
        child.stop()
        cleanup()


if __name__ == "__main__":
    main()
