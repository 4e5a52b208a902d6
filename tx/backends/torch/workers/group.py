"""A group of trainer workers as local processes, and what the coordinator needs of any group.

`LocalWorkers` starts `python -m tx.backends.torch.workers.worker` N times (the same interpreter and
environment as the server) and talks to each over its stdin/stdout pipes. A reader thread per worker turns
its replies into a queue, so a call waits on all workers at once and notices at once when one dies (its
pipe closes): the others may then be blocked in a collective, so the whole group is killed.
"""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import sys
import threading
import time
from typing import IO, Protocol

from tx.backends.torch.workers.messages import Reply, Request, WorkerSpec, read_frame, write_frame
from tx.inference.weight_sync.rendezvous import new_token

logger = logging.getLogger(__name__)
ERROR_GRACE_S = 10.0  # how long the other workers may take to answer once one has failed
Message = tuple[Request, bytes]


class WorkerDied(RuntimeError):
    """A trainer worker exited or stopped answering; the group it belonged to is gone."""


class WorkerGroup(Protocol):
    size: int

    def call(self, messages: dict[int, Message]) -> dict[int, tuple[Reply, bytes]]:
        """Send each rank its message and wait for all their replies; WorkerDied if a worker is lost."""
        ...

    def close(self, *, kill: bool = False) -> None:
        """Stop every worker; `kill` when the group is broken (its workers may be blocked in a collective)."""
        ...


def start_group(group: WorkerGroup, host: str) -> WorkerGroup:
    """Rendezvous: rank 0 opens the store on `host`, then every rank joins the process group through it. The store
    asks a token that only this process and the workers know (sent over their control channel)."""
    token = new_token()
    try:
        hello, _ = group.call({0: (Request(op="hello", address=host, token=token), b"")})[0]
        if hello.ok:
            join = Request(op="join", address=hello.address, token=token)
            replies = group.call({rank: (join, b"") for rank in range(group.size)})
            hello = next((reply for reply, _ in replies.values() if not reply.ok), hello)
        if not hello.ok:
            raise WorkerDied(f"trainer workers could not form a group: {hello.error}")
    except BaseException:
        group.close(kill=True)
        raise
    return group


class LocalWorkers:
    def __init__(self, spec: WorkerSpec) -> None:
        self.size = spec.world_size
        self._procs: list[subprocess.Popen[bytes]] = []
        self._replies: queue.Queue = queue.Queue()  # (rank, (reply, payload) or None once its pipe closed)
        for rank in range(self.size):
            module = "tx.backends.torch.workers.worker"
            cmd = [sys.executable, "-P", "-m", module, "--rank", str(rank), "--spec", spec.model_dump_json()]
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(os.environ))
            threading.Thread(
                target=_read_replies,
                args=(rank, proc, self._replies),
                daemon=True,
                name=f"trainer-worker-{rank}-replies",
            ).start()
            self._procs.append(proc)
        logger.info("started %d trainer workers: pids %s", self.size, [p.pid for p in self._procs])

    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs]

    def call(self, messages: dict[int, Message]) -> dict[int, tuple[Reply, bytes]]:
        for rank, (request, payload) in messages.items():
            try:
                write_frame(_pipe(self._procs[rank].stdin), request, payload)
            except (BrokenPipeError, OSError, ValueError) as exc:
                raise self._died(rank) from exc
        replies: dict[int, tuple[Reply, bytes]] = {}
        failed_at: float | None = None
        while len(replies) < len(messages):
            timeout = None if failed_at is None else max(0.0, failed_at + ERROR_GRACE_S - time.monotonic())
            try:
                rank, item = self._replies.get(timeout=timeout)
            except queue.Empty:
                raise blocked_after_error(replies) from None
            if item is None:
                raise self._died(rank)
            replies[rank] = item
            if not item[0].ok and failed_at is None:
                failed_at = time.monotonic()
        return replies

    def _died(self, rank: int) -> WorkerDied:
        proc = self._procs[rank]
        try:
            code = proc.wait(5)
        except subprocess.TimeoutExpired:
            code = None
        return WorkerDied(
            f"trainer worker {rank} (pid {proc.pid}) died"
            + (f" with exit code {code}" if code is not None else "")
        )

    def close(self, *, kill: bool = False) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                if kill:
                    proc.kill()
                elif proc.stdin is not None:
                    try:
                        proc.stdin.close()  # an idle worker exits on EOF
                    except OSError:
                        pass
        for proc in self._procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _read_replies(rank: int, proc: subprocess.Popen[bytes], replies: queue.Queue) -> None:
    try:
        while True:
            replies.put((rank, read_frame(_pipe(proc.stdout), Reply)))
    except (EOFError, OSError, ValueError):
        replies.put((rank, None))


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    assert stream is not None, "workers are started with stdin and stdout piped"
    return stream


def blocked_after_error(replies: dict[int, tuple[Reply, bytes]]) -> WorkerDied:
    """A worker failed and the others did not answer within the grace time: they are blocked in a collective
    their failed peer left."""
    rank, (reply, _) = next((r, item) for r, item in sorted(replies.items()) if not item[0].ok)
    return WorkerDied(f"trainer worker {rank} failed ({reply.error}) while the others were in a collective")
