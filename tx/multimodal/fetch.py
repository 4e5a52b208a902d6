"""Safe fetching of `image_asset_pointer` locations: local files under allowed roots, http(s) from allowed
hosts.

Rules (each refusal is a `UserError` that says why):
- A local location (an absolute path or a `file://` URL) is read only if, with every symlink resolved, it
  lies under one of `roots` and is a regular file. Nothing is readable when no root is configured. A path
  that is missing and one that lies outside the roots get the same answer, so the answer never tells
  whether a path outside the roots exists.
- An http(s) location is fetched only from a host in `hosts` ("name" or "name:port"). Its name is resolved
  once; every address it resolves to must be public (not loopback, private, link-local, shared, reserved,
  unspecified or multicast) unless `allow_private` is set or the address lies in one of `allowed_networks`.
  The connection goes to the checked address itself, so a second resolution cannot swap it ("DNS
  rebinding"). Redirects are followed by hand, at most `max_redirects`, and every hop is checked the same way.
- Caps: `max_bytes` per asset (the Content-Length is checked first, then the bytes as they arrive) and
  `timeout_s` for the whole fetch, redirects included.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import socket
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

from tx.types import UserError

Resolver = Callable[[str, int], list[str]]
"""(host, port) -> the IP addresses the host name resolves to."""

_REDIRECTS = (301, 302, 303, 307, 308)
_CHUNK = 1 << 16


@dataclass(frozen=True, kw_only=True)
class AssetPolicy:
    """Where image asset pointers may point, and how much they may cost."""

    roots: tuple[Path, ...] = ()
    hosts: tuple[str, ...] = ()
    allow_private: bool = False
    allowed_networks: tuple[str, ...] = ()
    max_bytes: int = 20 << 20
    timeout_s: float = 10.0
    max_redirects: int = 3

    def __post_init__(self) -> None:
        for network in self.allowed_networks:
            ipaddress.ip_network(network, strict=False)  # ValueError for a malformed one


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise UserError(f"image_asset_pointer: cannot resolve host {host!r}: {exc}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def fetch_asset(location: str, policy: AssetPolicy, resolve: Resolver = system_resolver) -> bytes:
    """The bytes at `location`, if `policy` allows it; a UserError naming the reason otherwise."""
    scheme = urlsplit(location).scheme.lower()
    if scheme in ("http", "https"):
        return _fetch_http(location, policy, resolve)
    if scheme == "file" or location.startswith("/"):
        return _read_local(location, policy)
    raise UserError(
        f"image_asset_pointer location {location!r} is neither an absolute path, a file:// URL "
        "nor an http(s) URL"
    )


# ---- local files


def _read_local(location: str, policy: AssetPolicy) -> bytes:
    parts = urlsplit(location)
    raw = unquote(parts.path) if parts.scheme.lower() == "file" else location
    if parts.scheme.lower() == "file" and parts.netloc not in ("", "localhost"):
        raise UserError(f"image_asset_pointer: file URL {location!r} names a host; only local files are read")
    if not policy.roots:
        raise UserError("image_asset_pointer: this server reads no local files (no asset roots configured)")
    unreadable = UserError(f"image_asset_pointer: {raw!r} is no file under the asset roots this server may read")
    try:
        path = Path(raw).resolve(strict=True)
    except (OSError, RuntimeError):
        raise unreadable from None
    if not any(path.is_relative_to(root.resolve()) for root in policy.roots):
        raise unreadable
    return _read_file(path, policy.max_bytes)


def _read_file(path: Path, max_bytes: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise UserError(f"image_asset_pointer: cannot read {str(path)!r}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"image_asset_pointer: {str(path)!r} is not a regular file")
        if info.st_size > max_bytes:
            raise UserError(f"image_asset_pointer: {info.st_size} bytes is over the limit of {max_bytes}")
        parts, size = [], 0
        while size <= max_bytes and (part := os.read(fd, max_bytes + 1 - size)):
            parts.append(part)
            size += len(part)
        data = b"".join(parts)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise UserError(f"image_asset_pointer: the file is over the limit of {max_bytes} bytes")
    return data


# ---- http(s)


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str
    port: int
    address: str
    path: str


def address_refusal(address: str, policy: AssetPolicy) -> str | None:
    """Why `policy` refuses connecting to IP `address` (e.g. "loopback address 127.0.0.1"), or None.

    An IPv6 address that embeds an IPv4 one (IPv4-mapped ::ffff:a.b.c.d, IPv4-compatible ::a.b.c.d, NAT64
    64:ff9b::/96, 6to4 2002::/16, Teredo 2001::/32) is refused when the IPv4 address it reaches would be; the
    local-use NAT64 prefix 64:ff9b:1::/48 is never public."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if _allowed_network(ip, policy):
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _LOCAL_NAT64 and not policy.allow_private:
            return f"non-public address {ip} (local-use NAT64)"
        for embedded in _embedded_ipv4(ip):
            reason = address_refusal(str(embedded), policy)
            if reason is not None:
                return reason if ip.ipv4_mapped is not None else f"{reason} (embedded in {ip})"
        if ip.ipv4_mapped is not None:
            return None
    if ip.is_multicast or ip.is_unspecified:
        return f"{'multicast' if ip.is_multicast else 'unspecified'} address {ip}"
    if ip.is_global or policy.allow_private:
        return None
    kind = "loopback" if ip.is_loopback else "link-local" if ip.is_link_local else (
        "private" if ip.is_private else "non-public")
    return f"{kind} address {ip}"


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")
_COMPATIBLE = ipaddress.ip_network("::/96")  # IPv4-compatible (deprecated), and :: and ::1 themselves


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries, by every form that routes to one."""
    found = [] if ip.ipv4_mapped is None else [ip.ipv4_mapped]
    if ip in _NAT64 or (ip in _COMPATIBLE and int(ip) > 1):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)  # (server, client)
    return found


def _allowed_network(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, policy: AssetPolicy) -> bool:
    return any(ip in ipaddress.ip_network(net, strict=False) for net in policy.allowed_networks)


def host_allowed(host: str, port: int, policy: AssetPolicy) -> bool:
    """Whether `policy.hosts` lists `host` ("name": any port) or `host:port`."""
    host = host.lower().rstrip(".")
    shown = f"[{host}]" if ":" in host else host  # IPv6 literals are bracketed in entries with a port
    candidates = {host, shown, f"{shown}:{port}"}
    return any(entry.lower().rstrip(".") in candidates for entry in policy.hosts)


def check_url(url: str, policy: AssetPolicy, resolve: Resolver = system_resolver) -> _Target:
    """Where `url` may be fetched from (the checked address), or a UserError saying why it may not."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise UserError(f"image_asset_pointer: {url!r} is not an http(s) URL")
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise UserError(f"image_asset_pointer: {url!r} has an invalid port") from None
    if not host:
        raise UserError(f"image_asset_pointer: {url!r} names no host")
    port = port or (443 if scheme == "https" else 80)
    if not host_allowed(host, port, policy):
        raise UserError(f"image_asset_pointer: host {host!r} (port {port}) is not one this server may "
                        "fetch from")
    addresses = resolve(host, port)
    if not addresses:
        raise UserError(f"image_asset_pointer: host {host!r} resolves to no address")
    for address in addresses:
        reason = address_refusal(address, policy)
        if reason is not None:
            raise UserError(f"image_asset_pointer: {host!r} resolves to a {reason}, which is refused")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return _Target(scheme, host, port, addresses[0], path)


def _fetch_http(url: str, policy: AssetPolicy, resolve: Resolver) -> bytes:
    deadline = time.monotonic() + policy.timeout_s
    for _ in range(policy.max_redirects + 1):
        target = check_url(url, policy, resolve)
        status, location, body = _get(target, policy.max_bytes, deadline)
        if status in _REDIRECTS:
            if not location:
                raise UserError(f"image_asset_pointer: {url!r} redirected without a Location")
            url = urljoin(url, location)
            continue
        if status != 200:
            raise UserError(f"image_asset_pointer: {url!r} answered HTTP {status}")
        return body
    raise UserError(f"image_asset_pointer: more than {policy.max_redirects} redirects")


class _PinnedHTTP(http.client.HTTPConnection):
    """An HTTP connection to a fixed, already checked address (the Host header keeps the name)."""

    def __init__(self, target: _Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    """An HTTPS connection to a fixed address; the certificate is checked against the host name."""

    def __init__(self, target: _Target, timeout: float) -> None:
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        context = self._context  # pyright: ignore[reportAttributeAccessIssue]  (HTTPSConnection's; typeshed omits it)
        self.sock = context.wrap_socket(sock, server_hostname=self.host)


def _get(target: _Target, max_bytes: int, deadline: float) -> tuple[int, str | None, bytes]:
    remaining = _remaining(deadline)
    connection = (_PinnedHTTPS if target.scheme == "https" else _PinnedHTTP)(target, remaining)
    try:
        connection.request("GET", target.path, headers={"Accept": "image/png, image/jpeg"})
        response = connection.getresponse()
        if response.status in _REDIRECTS or response.status != 200:
            return response.status, response.getheader("Location"), b""
        declared = response.getheader("Content-Length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            raise UserError(f"image_asset_pointer: {declared} bytes is over the limit of {max_bytes} bytes")
        return 200, None, _read_capped(response, connection, max_bytes, deadline)
    except (OSError, http.client.HTTPException) as exc:
        raise UserError(f"image_asset_pointer: fetching {target.host}:{target.port} failed: {exc}") from None
    finally:
        connection.close()


def _read_capped(response, connection, max_bytes: int, deadline: float) -> bytes:
    parts, size = [], 0
    while True:
        if connection.sock is not None:
            connection.sock.settimeout(_remaining(deadline))
        chunk = response.read(_CHUNK)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > max_bytes:
            raise UserError(f"image_asset_pointer: the asset is over the limit of {max_bytes} bytes")
        parts.append(chunk)


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise UserError("image_asset_pointer: fetching the asset took longer than this server allows")
    return left
