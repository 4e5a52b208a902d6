"""Every socket a tx server's process tree listens on (`ss -ltnp`), checked: bound to loopback when tx is, and
closed to anyone without the key or the cluster secret. The shared-server probe's finding 5: the weight-transfer
rendezvous (torch's TCPStore) listened on every interface, without authentication, while tx was on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import tinker
from tinker import types
from txserver import TxServer

from tx.inference.protocol import ROUTE_PAUSE

LOOPBACK = {"127.0.0.1", "::1", "[::1]"}


def process_tree(pid: int) -> set[int]:
    """`pid` and every process under it (engines run in sessions of their own, so a process group would miss them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = set(), [pid]
    while todo:
        current = todo.pop()
        tree.add(current)
        todo.extend(children.get(current, []))
    return tree


def listening(pids: set[int]) -> list[tuple[str, int, int]]:
    """(address, port, pid) of every TCP socket those processes listen on."""
    found = []
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines():
        owners = [int(part.split("=")[1]) for part in line.replace(",", " ").split() if part.startswith("pid=")]
        owner = next((pid for pid in owners if pid in pids), None)
        if owner is not None:
            address, port = line.split()[3].rsplit(":", 1)
            found.append((address, int(port), owner))
    return found


def kind_of(port: int) -> str:
    """What listens on `port`, asked without any credential, and whether it let us in."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.settimeout(0.5)
        try:
            greeting = conn.recv(64)  # the rendezvous store speaks first: its challenge
        except TimeoutError:
            greeting = None
        if greeting:
            conn.settimeout(5)
            conn.sendall(b"\0" * 32)  # a wrong answer
            try:
                assert conn.recv(64) == b"", "the rendezvous store answered a client without its token"
            except ConnectionResetError:
                pass
            return "rendezvous"
    base = f"http://127.0.0.1:{port}"
    try:
        if httpx.get(f"{base}/api/v1/healthz", timeout=5).status_code == 200:
            assert httpx.get(f"{base}/api/v1/training_runs", timeout=5).status_code == 401
            return "api"
        if httpx.get(f"{base}/health", timeout=5).status_code == 200:
            assert httpx.post(f"{base}{ROUTE_PAUSE}", json={}, timeout=5).status_code == 401
            return "engine"
    except httpx.HTTPError:
        pass
    return "gloo"  # a gloo device's pair listener: it takes only the pairs of its group (see the module docs)


def kinds_of(sockets: list[tuple[str, int, int]]) -> list[str]:
    """`kind_of` each socket's port, all at once: a gloo listener takes the whole 5 s HTTP timeout to tell."""
    with ThreadPoolExecutor(max(1, len(sockets))) as pool:
        return list(pool.map(kind_of, [port for _, port, _ in sockets]))


def test_every_listening_socket_is_private_and_guarded(server: TxServer,
                                                       service_client: tinker.ServiceClient) -> None:
    training = service_client.create_lora_training_client("tiny-qwen3", rank=4).result()
    sampler = training.save_weights_and_get_sampling_client().result()  # starts the engine, pushes weights over gloo
    sampler.sample(types.ModelInput.from_ints([1, 2, 3]), 1, types.SamplingParams(max_tokens=2)).result()
    assert server.proc is not None
    sockets = listening(process_tree(server.proc.pid))
    assert all(address in LOOPBACK for address, _, _ in sockets), sockets
    kinds = kinds_of(sockets)
    assert {"api", "engine", "rendezvous"} <= set(kinds), list(zip(sockets, kinds))
    assert kinds.count("api") == 1


def test_trainer_workers_listen_privately(workers_server: TxServer) -> None:
    """The trainer workers' rendezvous (once a TCPStore on every interface) and their gloo group."""
    with workers_server.client() as client:
        training = client.create_lora_training_client("tiny-qwen3", rank=4).result()
        datum = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]),
                            loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]})
        training.forward_backward([datum], "cross_entropy").result()
        assert workers_server.proc is not None
        sockets = listening(process_tree(workers_server.proc.pid))
    assert all(address in LOOPBACK for address, _, _ in sockets), sockets
    kinds = kinds_of(sockets)
    assert "rendezvous" in kinds and kinds.count("api") == 1, list(zip(sockets, kinds))
