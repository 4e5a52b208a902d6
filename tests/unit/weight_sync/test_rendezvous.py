"""The transfer groups' rendezvous store (tx/inference/weight_sync/rendezvous.py): bound to the group's address
only, and usable only with the group's token. The shared-server probe's finding 5: torch's TCPStore listened on
every interface while tx was bound to loopback, and an anonymous client wrote and deleted its keys."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest

from tx.inference.weight_sync.rendezvous import RemoteStore, StoreServer, new_token
from tx.inference.weight_sync.types import WeightSyncError

TIMEOUT = timedelta(seconds=5)


@pytest.fixture
def server():
    token = new_token()
    server = StoreServer("127.0.0.1", 0, token, TIMEOUT)
    yield server, token
    server.close()


def test_it_listens_on_the_groups_address_only(server) -> None:
    host, _ = server[0]._listener.getsockname()
    assert host == "127.0.0.1"


def test_the_token_holder_uses_the_store(server) -> None:
    store_server, token = server
    client = RemoteStore("127.0.0.1", store_server.port, token, TIMEOUT)
    client.set("a", b"1")
    assert store_server.store.get("a") == b"1"
    store_server.store.set("b", b"2")
    assert client.get("b") == b"2" and client.add("n", 3) == 3 and client.check(["a", "b"])
    assert client.delete_key("a") and client.num_keys() >= 2
    client.close()


def test_a_client_without_the_token_reaches_nothing(server) -> None:
    store_server, _ = server
    with pytest.raises(WeightSyncError, match="refused this rank"):
        RemoteStore("127.0.0.1", store_server.port, new_token(), TIMEOUT)
    with socket.create_connection(("127.0.0.1", store_server.port), timeout=5) as raw:  # a raw client, as the probe's
        raw.recv(16)
        raw.sendall(b"\0" * 32 + b'\0\0\0\x1c{"op": "set", "key": "x", "value": "MQ=="}')
        try:
            assert raw.recv(16) == b""  # closed without an answer ...
        except ConnectionResetError:
            pass  # ... or reset, its frame unread
    assert store_server.store.num_keys() == 0 or not store_server.store.check(["x"])
