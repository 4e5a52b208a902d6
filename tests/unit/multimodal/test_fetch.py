"""Asset pointers: the address decision (name resolution stubbed), allowed hosts, redirects, caps, roots.

Only loopback is ever connected to: a stub resolver maps test names to 127.0.0.1, and addresses that must be
refused are refused before any connection.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tx.multimodal.fetch import AssetPolicy, address_refusal, check_url, fetch_asset
from tx.types import UserError

PUBLIC = ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111", "64:ff9b::808:808", "2002:808:808::1",
          "::8.8.8.8", "::ffff:8.8.8.8"]
REFUSED = {
    "127.0.0.1": "loopback", "127.8.9.10": "loopback", "::1": "loopback", "::ffff:127.0.0.1": "loopback",
    "10.0.0.1": "private", "172.16.5.4": "private", "192.168.1.1": "private", "fc00::1": "private",
    "169.254.169.254": "link-local", "fe80::1": "link-local", "::ffff:169.254.169.254": "link-local",
    "100.64.0.1": "non-public", "0.0.0.0": "unspecified", "::": "unspecified", "224.0.0.1": "multicast",
    # IPv6 forms that embed an IPv4 address (the shared-server probe's finding 8): NAT64, 6to4, IPv4-compatible,
    # Teredo (its client address is stored inverted) and the local-use NAT64 prefix
    "64:ff9b::7f00:1": "loopback", "64:ff9b::a9fe:a9fe": "link-local", "64:ff9b::a00:1": "private",
    "2002:7f00:1::": "loopback", "2002:a00:1:1::1": "private", "::127.0.0.1": "loopback", "::10.0.0.1": "private",
    "2001:0:4136:e378:8000:63bf:80ff:fffe": "loopback", "64:ff9b:1::8.8.8.8": "non-public",
}


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address: str) -> None:
    assert address_refusal(address, AssetPolicy()) is None


@pytest.mark.parametrize("address", sorted(REFUSED))
def test_non_public_addresses_are_refused(address: str) -> None:
    reason = address_refusal(address, AssetPolicy())
    assert reason is not None and reason.startswith(REFUSED[address])


def test_explicit_permission() -> None:
    private = AssetPolicy(allow_private=True)
    assert address_refusal("10.0.0.1", private) is None and address_refusal("169.254.1.1", private) is None
    assert address_refusal("224.0.0.1", private) is not None  # multicast stays refused
    network = AssetPolicy(allowed_networks=("10.1.2.0/24",))
    assert address_refusal("10.1.2.3", network) is None
    assert address_refusal("10.1.3.1", network) == "private address 10.1.3.1"


def stub(table: dict[str, list[str]]):
    def resolve(host: str, port: int) -> list[str]:
        return table[host]

    return resolve


def test_check_url_decides_after_resolution() -> None:
    policy = AssetPolicy(hosts=("images.example", "cdn.example:8443", "[2606:4700::1]"))
    resolve = stub({"images.example": ["93.184.216.34"], "cdn.example": ["8.8.8.8"],
                    "2606:4700::1": ["2606:4700::1"]})
    target = check_url("https://images.example/a.png?x=1", policy, resolve)
    assert (target.host, target.port, target.address, target.path) == ("images.example", 443, "93.184.216.34",
                                                                       "/a.png?x=1")
    assert check_url("http://cdn.example:8443/a", policy, resolve).address == "8.8.8.8"
    assert check_url("http://[2606:4700::1]/a", policy, resolve).port == 80
    for url in ("http://cdn.example/a", "http://other.example/a", "ftp://images.example/a"):
        with pytest.raises(UserError):
            check_url(url, policy, resolve)


@pytest.mark.parametrize("addresses", [["10.0.0.7"], ["93.184.216.34", "127.0.0.1"], ["169.254.169.254"]])
def test_allowed_host_resolving_to_a_non_public_address_is_refused(addresses: list[str]) -> None:
    policy = AssetPolicy(hosts=("images.example",))
    with pytest.raises(UserError, match="resolves to a"):
        check_url("http://images.example/a.png", policy, stub({"images.example": addresses}))


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, tuple[int, dict[str, str], bytes]] = {}
    hosts: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        _Handler.hosts.append(self.headers.get("Host", ""))
        if self.path == "/slow":
            time.sleep(2)
        if self.path == "/stream":  # no Content-Length, more than the cap
            self.send_response(200)
            self.end_headers()
            for _ in range(64):
                self.wfile.write(b"x" * 1024)
            return
        status, headers, body = _Handler.routes.get(self.path, (404, {}, b""))
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_port
    server.shutdown()


def local_policy(**overrides) -> AssetPolicy:
    return AssetPolicy(hosts=("images.test", "rebind.test", "meta.test"), allowed_networks=("127.0.0.1/32",),
                       **overrides)


RESOLVE = stub({"images.test": ["127.0.0.1"], "rebind.test": ["10.0.0.5"], "meta.test": ["169.254.169.254"]})


def test_fetch_connects_to_the_checked_address_with_the_host_name(port: int) -> None:
    _Handler.routes["/a.png"] = (200, {}, b"PNGDATA")
    _Handler.hosts.clear()
    assert fetch_asset(f"http://images.test:{port}/a.png", local_policy(), RESOLVE) == b"PNGDATA"
    assert _Handler.hosts == [f"images.test:{port}"]


def test_redirects_are_followed_and_checked(port: int) -> None:
    _Handler.routes["/a.png"] = (200, {}, b"PNGDATA")
    _Handler.routes["/hop"] = (302, {"Location": "/a.png"}, b"")
    _Handler.routes["/to-private"] = (301, {"Location": f"http://rebind.test:{port}/a.png"}, b"")
    _Handler.routes["/to-metadata"] = (307, {"Location": "http://meta.test/latest/meta-data"}, b"")
    _Handler.routes["/to-other-host"] = (302, {"Location": "http://elsewhere.test/a.png"}, b"")
    _Handler.routes["/loop"] = (302, {"Location": "/loop"}, b"")
    assert fetch_asset(f"http://images.test:{port}/hop", local_policy(), RESOLVE) == b"PNGDATA"
    for path, reason in [("/to-private", "private address 10.0.0.5"), ("/to-metadata", "link-local"),
                         ("/to-other-host", "not one this server may fetch from"), ("/loop", "redirects")]:
        with pytest.raises(UserError, match=reason):
            fetch_asset(f"http://images.test:{port}{path}", local_policy(), RESOLVE)


def test_fetch_caps(port: int) -> None:
    _Handler.routes["/big"] = (200, {}, b"x" * 5000)
    _Handler.routes["/missing"] = (404, {}, b"")
    with pytest.raises(UserError, match="over the limit"):
        fetch_asset(f"http://images.test:{port}/big", local_policy(max_bytes=4000), RESOLVE)
    with pytest.raises(UserError, match="over the limit"):
        fetch_asset(f"http://images.test:{port}/stream", local_policy(max_bytes=4000), RESOLVE)
    with pytest.raises(UserError, match="timed out|longer than"):
        fetch_asset(f"http://images.test:{port}/slow", local_policy(timeout_s=0.5), RESOLVE)
    with pytest.raises(UserError, match="HTTP 404"):
        fetch_asset(f"http://images.test:{port}/missing", local_policy(), RESOLVE)


def test_local_files_only_under_roots(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "ok.png").write_bytes(b"OK")
    (outside / "secret.png").write_bytes(b"SECRET")
    os.symlink(outside / "secret.png", root / "link.png")
    (root / "dir").mkdir()
    policy = AssetPolicy(roots=(root,), max_bytes=10)
    assert fetch_asset(str(root / "ok.png"), policy) == b"OK"
    assert fetch_asset(f"file://{root / 'ok.png'}", policy) == b"OK"
    (root / "big.png").write_bytes(b"x" * 11)
    refused = {
        str(outside / "secret.png"): "no file under the asset roots",
        str(root / "link.png"): "no file under the asset roots",
        str(root / ".." / "outside" / "secret.png"): "no file under the asset roots",
        str(root / "dir"): "not a regular file",
        str(root / "big.png"): "over the limit",
        str(root / "nothing.png"): "no file under the asset roots",
        "relative/ok.png": "neither an absolute path",
        f"file://otherhost{root / 'ok.png'}": "names a host",
    }
    for location, reason in refused.items():
        with pytest.raises(UserError, match=reason):
            fetch_asset(location, policy)
    with pytest.raises(UserError, match="no asset roots"):
        fetch_asset(str(root / "ok.png"), AssetPolicy())


def test_a_missing_file_gets_the_same_answer_inside_and_outside_the_roots(tmp_path: Path) -> None:
    """The answer must not tell whether a path outside the roots exists."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "exists.png").write_bytes(b"SECRET")
    policy = AssetPolicy(roots=(root,))

    def answer(path: Path) -> str:
        with pytest.raises(UserError) as info:
            fetch_asset(str(path), policy)
        return str(info.value).replace(str(path), "<path>")

    answers = {answer(p) for p in (root / "missing.png", outside / "missing.png", outside / "exists.png",
                                   tmp_path / "no-such-dir" / "x.png")}
    assert len(answers) == 1, answers
