"""A scrape of a metrics listener as Prometheus makes one (HTTPS, a client certificate, the
target's name checked), or as a stranger would, for tests that check who is answered."""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass

from gpufleet.common.trust.pki import TlsFiles


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: str


def client_context(ca: str, client: TlsFiles | None) -> ssl.SSLContext:
    """Trusts the deployment's CA only; presents ``client``'s certificate when given."""
    context = ssl.create_default_context(cafile=ca)
    if client is not None:
        context.load_cert_chain(str(client.cert), str(client.key))
    return context


def get(
    port: int,
    *,
    context: ssl.SSLContext | None,
    server_name: str = "",
    path: str = "/metrics",
    timeout: float = 10.0,
) -> Answer:
    """``GET path`` on 127.0.0.1:``port``; plaintext when ``context`` is None. Raises
    ``ssl.SSLError`` or ``OSError`` when the listener refuses the handshake (TLS 1.3 says so
    only when the client reads)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        conn = context.wrap_socket(raw, server_hostname=server_name) if context is not None else raw
        with conn:
            conn.sendall(f"GET {path} HTTP/1.0\r\nHost: {server_name or '127.0.0.1'}\r\n\r\n".encode())
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/"):
        raise ConnectionError(f"no HTTP answer: {head[:40]!r}")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return Answer(int(status_line.split()[1]), headers, body.decode())


def sample(body: str, name: str, **labels: str) -> float | None:
    """The value of the one sample of ``name`` whose labels include ``labels`` (the text
    format), or None when there is none."""
    for line in body.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        if metric != name:
            continue
        if all(f'{k}="{v}"' in label_text for k, v in labels.items()):
            return float(value)
    return None
