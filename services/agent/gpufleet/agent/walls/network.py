"""No network but the job's own tunnels, and an egress filter for the platform's own code.

Every job runs in a network namespace of its own with nothing but loopback: no route out,
no name lookups, and neither the agent's port nor any control-plane port (they listen on
the host's loopback, which is another namespace). Its only ways out are Unix sockets in
its read-only ``/run/gpufleet``, which its runner (outside, root) forwards:

- ``model.sock`` and ``voice.sock`` to the configured model gateway and voice service —
  bytes only; each service still demands the job's own token;
- ``egress.sock``, only for a kind that runs nothing but the platform's code: an HTTP
  proxy (``CONNECT`` and absolute-URI requests) that resolves the name itself and refuses
  loopback, the host's own addresses, link-local (the cloud metadata service,
  169.254.169.254 / ``metadata.google.internal``), private and shared ranges. Inside the
  sandbox a small forwarder offers it as ``HTTPS_PROXY=http://127.0.0.1:3128``.

A refusal never sends a packet: the address is checked before any connect, and the proxy
connects to the very address it checked (no second lookup to rebind).
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from gpufleet.agent.walls.slot_init import pump

log = logging.getLogger(__name__)

EGRESS_PORT = 3128
MAX_HEAD = 16 * 1024
MAX_CONNECTIONS = 64
IO_TIMEOUT_S = 300.0

_REFUSED_V4 = [
    (ipaddress.ip_network(n), why)
    for n, why in (
        ("0.0.0.0/8", "an unspecified address"),
        ("10.0.0.0/8", "a private range"),
        ("100.64.0.0/10", "a shared (carrier-grade NAT) range"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local (the cloud metadata service)"),
        ("172.16.0.0/12", "a private range"),
        ("192.168.0.0/16", "a private range"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "a reserved range"),
    )
]
_REFUSED_V6 = [
    (ipaddress.ip_network(n), why)
    for n, why in (
        ("::/128", "an unspecified address"),
        ("::1/128", "loopback"),
        ("fe80::/10", "link-local (the cloud metadata service)"),
        ("fc00::/7", "a private range (includes AWS's fd00:ec2::254)"),
        ("ff00::/8", "multicast"),
    )
]
REFUSED_NAMES = ("localhost", "metadata", "metadata.google.internal")


def name_refusal(host: str) -> str | None:
    name = host.rstrip(".").lower()
    if name in REFUSED_NAMES or name.endswith((".internal", ".localhost")):
        return f"{host} is a platform-internal name"
    return None


def address_refusal(address: str, is_local: Callable[[str], bool]) -> str | None:
    """Why ``address`` may not be reached from a slot, or None when it may; pure but for
    ``is_local`` (is it one of this host's own addresses?)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    table = _REFUSED_V4 if isinstance(ip, ipaddress.IPv4Address) else _REFUSED_V6
    for network, why in table:
        if ip in network:
            return f"{address} is {why}"
    if is_local(str(ip)):
        return f"{address} is one of this machine's own addresses"
    return None


def is_local_address(address: str) -> bool:
    """Whether ``address`` is assigned to this host (binding to it succeeds only then)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


@dataclass(frozen=True)
class Destination:
    host: str
    port: int


class EgressRefused(Exception):
    pass


def resolve_allowed(
    dest: Destination,
    resolve: Callable[[str, int], list[str]],
    is_local: Callable[[str], bool] = is_local_address,
) -> str:
    """The one address to connect to, or EgressRefused naming why not. Every address the
    name resolves to must be allowed: a name that also points inward is refused whole."""
    why = name_refusal(dest.host)
    if why:
        raise EgressRefused(why)
    if not 0 < dest.port < 65536:
        raise EgressRefused(f"port {dest.port} is out of range")
    try:
        addresses = resolve(dest.host, dest.port)
    except OSError as err:
        raise EgressRefused(f"{dest.host} does not resolve: {err}") from err
    if not addresses:
        raise EgressRefused(f"{dest.host} does not resolve")
    for address in addresses:
        why = address_refusal(address, is_local)
        if why:
            raise EgressRefused(why)
    return addresses[0]


def system_resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def parse_request_head(head: bytes) -> tuple[Destination, bytes]:
    """The destination of a proxy request and the bytes to send it (b"" for CONNECT)."""
    line, _, rest = head.partition(b"\r\n")
    try:
        method, target, version = line.decode("ascii").split(" ")
    except (UnicodeDecodeError, ValueError) as err:
        raise EgressRefused("malformed request line") from err
    if method == "CONNECT":
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise EgressRefused("CONNECT needs host:port")
        return Destination(host.strip("[]"), int(port)), b""
    if not target.startswith("http://"):
        raise EgressRefused("only CONNECT and absolute http:// requests are proxied")
    url = urlsplit(target)
    try:
        url_port = url.port or 80
    except ValueError as err:
        raise EgressRefused("malformed port") from err
    if not url.hostname:
        raise EgressRefused("the request names no host")
    path = (url.path or "/") + (f"?{url.query}" if url.query else "")
    origin_line = f"{method} {path} {version}".encode("ascii")
    return Destination(url.hostname, url_port), origin_line + b"\r\n" + rest


def splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    other = threading.Thread(target=pump, args=(b, a), daemon=True)
    other.start()
    pump(a, b)
    other.join(IO_TIMEOUT_S)


class UnixListener:
    """Accepts on a Unix socket only the slot's group may use, one thread per connection."""

    def __init__(self, path: Path, gid: int, handle: Callable[[socket.socket], None]) -> None:
        self.path = path
        self.handle = handle
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        os.chown(path, 0, gid)
        path.chmod(0o660)
        self.sock.listen(16)
        self._thread = threading.Thread(target=self._serve, name=f"tunnel {path.name}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                conn.close()  # a job that opens too many only hurts itself
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(IO_TIMEOUT_S)
            self.handle(conn)
        except Exception:  # one connection must not end the tunnel
            log.exception("tunnel %s: connection failed", self.path.name)
        finally:
            conn.close()
            self._slots.release()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.path.unlink(missing_ok=True)


def forward_to(address: str) -> Callable[[socket.socket], None]:
    """A tunnel handler that forwards a connection's bytes to ``host:port``."""
    host, _, port = address.rpartition(":")

    def handle(conn: socket.socket) -> None:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=30) as upstream:
            upstream.settimeout(IO_TIMEOUT_S)
            splice(conn, upstream)

    return handle


def egress_proxy(
    resolve: Callable[[str, int], list[str]] = system_resolve,
    is_local: Callable[[str], bool] = is_local_address,
) -> Callable[[socket.socket], None]:
    """A tunnel handler speaking just enough HTTP proxy to filter where a job connects."""

    def handle(conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            data = conn.recv(4096)
            if not data:
                return
            head += data
            if len(head) > MAX_HEAD:
                conn.sendall(_refusal("request head too large"))
                return
        head_only, _, body = head.partition(b"\r\n\r\n")
        try:
            dest, first = parse_request_head(head_only + b"\r\n\r\n")
            address = resolve_allowed(dest, resolve, is_local)
        except EgressRefused as refused:
            log.warning("egress refused: %s", refused)
            conn.sendall(_refusal(str(refused)))
            return
        try:
            upstream = socket.create_connection((address, dest.port), timeout=30)
        except OSError as err:
            conn.sendall(_refusal(f"{dest.host}:{dest.port} unreachable: {err}", status=b"502 Bad Gateway"))
            return
        with upstream:
            upstream.settimeout(IO_TIMEOUT_S)
            if first:
                upstream.sendall(first + body)
            else:
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                if body:
                    upstream.sendall(body)
            splice(conn, upstream)

    return handle


def _refusal(why: str, status: bytes = b"403 Forbidden") -> bytes:
    text = f"gpufleet egress: {why}\n".encode()
    return (
        b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\nConnection: close\r\n"
        b"Content-Length: " + str(len(text)).encode() + b"\r\n\r\n" + text
    )
