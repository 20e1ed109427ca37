"""The metrics listener: a process's OpenTelemetry metrics, served for Prometheus to scrape.

Each service serves ``GET /metrics`` on an address of its own (``GPUFLEET_METRICS_ADDRESS``)
because Prometheus pulls over HTTP and cannot speak gRPC. The port is protected like every
other port of a deployment: HTTPS with the process's own certificate, a client certificate
of the deployment required in the handshake, and only the deployment's ``metrics`` identity
answered (a scheduler's or an operator's certificate gets 403: what the fleet costs is not
every part's business). A process running ``GPUFLEET_INSECURE`` serves plaintext, as its
gRPC port does, and says so.

Why not ``prometheus_client.start_http_server`` (which has certificate options): it does the
TLS handshake in its one accepting thread, so a client that connects and says nothing
holds up every scrape, and it cannot see who is calling. Here the handshake runs in the
request's own thread under a deadline, and the verified certificate names the caller. The
exposition itself (content negotiation, the text format, gzip) is prometheus_client's.

The certificate and trust bundle follow the process's files (:mod:`gpufleet.common.trust.reload`):
each connection is handshaken with the ones in force when it comes, so a renewed certificate
is served to the next scrape without a restart.
"""

from __future__ import annotations

import gzip
import logging
import os
import socket
import ssl
import tempfile
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.material import TlsMaterial
from gpufleet.common.trust.peer import identity_from_auth_context
from gpufleet.common.trust.reload import TlsReloader
from gpufleet.common.trust.transport import Transport

log = logging.getLogger(__name__)

PATH = "/metrics"
# Real seconds a caller has to finish the handshake and send its request: a silent
# connection holds one thread for this long, never the listener.
REQUEST_TIMEOUT_S = 10.0


class MetricsAddressError(ValueError):
    """``GPUFLEET_METRICS_ADDRESS`` is not ``host:port``."""


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:9451`` for IPv6); the port may be 0 (tests)."""
    host, sep, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise MetricsAddressError(f"not host:port: {address!r}")
    return host, int(port)


@dataclass(frozen=True)
class ScrapeAuthority:
    """Who may read the metrics: the deployment's ``metrics`` identity, and no one else."""

    deployment: str

    def allows(self, caller: Identity | None) -> bool:
        return caller is not None and caller.role is Role.METRICS and caller.deployment == self.deployment


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_S
    # HTTP/1.0: one scrape a connection. A kept-alive connection would hold a thread between
    # scrapes, and a scrape every few seconds does not need one.

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != PATH:
            self._answer(HTTPStatus.NOT_FOUND, b"only /metrics is served here\n")
            return
        if self.server.authority is not None:
            caller = _caller(self.connection)
            if not self.server.authority.allows(caller):
                log.info(
                    "metrics scrape refused to %s",
                    caller or "a caller with no identity of this deployment",
                    extra={"fields": {"caller": str(caller) if caller else None}},
                )
                self._answer(HTTPStatus.FORBIDDEN, b"only the deployment's metrics identity may scrape\n")
                return
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        body = encoder(self.server.registry)
        headers = {"Content-Type": content_type}
        if gzip_accepted(self.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        self._answer(HTTPStatus.OK, body, headers)

    def _answer(self, status: HTTPStatus, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {"Content-Type": "text/plain; charset=utf-8"}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Every scrape is not news: http.server would print each one to stderr."""


def _caller(connection: Any) -> Identity | None:
    """The identity the caller's verified certificate names (None over plaintext)."""
    if not isinstance(connection, ssl.SSLSocket):
        return None
    der = connection.getpeercert(binary_form=True)
    if not der:
        return None
    pem = ssl.DER_cert_to_PEM_cert(der).encode()
    return identity_from_auth_context({"x509_pem_cert": [pem]})


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # A second process on the same address is an error, never a silent split of the scrapes.
    allow_reuse_port = False

    def __init__(
        self,
        address: tuple[str, int],
        registry: CollectorRegistry,
        contexts: _ServerContexts | None,
        authority: ScrapeAuthority | None,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.registry = registry
        self.contexts = contexts
        self.authority = authority
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """In the request's own thread: the TLS handshake first, under the deadline, with
        the certificate in force now."""
        if self.contexts is not None:
            request.settimeout(REQUEST_TIMEOUT_S)
            try:
                request = self.contexts.current().wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                # No certificate, one of another CA, a port scan: refused in the handshake.
                log.debug("metrics handshake from %s refused: %s", client_address, exc)
                return
        try:
            super().finish_request(request, client_address)
        finally:
            if request is not None and self.contexts is not None:
                request.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A caller that went away mid-answer is not a stack trace."""
        log.debug("metrics request from %s failed", client_address, exc_info=True)


def _server_context(material: TlsMaterial) -> ssl.SSLContext:
    """Serve this certificate; require one the trust bundle's CAs signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # ssl loads a certificate chain and key only from a file: the checked material goes
    # through a private one (never the live files, which may change between two reads).
    fd, path = tempfile.mkstemp(prefix="gpufleet-metrics-", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(material.cert + b"\n" + material.key)
        context.load_cert_chain(certfile=path)
    finally:
        os.unlink(path)
    context.load_verify_locations(cadata=material.ca.decode("ascii"))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


class _ServerContexts:
    """The listener's TLS context, made again when the process's files change."""

    def __init__(self, reloader: TlsReloader) -> None:
        self._reloader = reloader
        self._lock = threading.Lock()
        self._material = reloader.current()
        self._context = _server_context(self._material)

    def current(self) -> ssl.SSLContext:
        material = self._reloader.current()
        with self._lock:
            if material is not self._material:
                self._context = _server_context(material)
                self._material = material
            return self._context


class MetricsListener:
    """A serving metrics listener; it serves until :meth:`close` or the process ends (a
    scrape cut short by an exit is only a missed sample)."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="metrics-listener", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        scheme = "https" if self._server.contexts is not None else "http"
        host = str(self._server.server_address[0])
        host = f"[{host}]" if ":" in host else host
        return f"{scheme}://{host}:{self.port}{PATH}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_metrics(address: str, registry: CollectorRegistry, transport: Transport) -> MetricsListener:
    """Serve ``registry`` on ``address``: HTTPS for the deployment's metrics identity only,
    or plaintext when ``transport`` is insecure. Raises OSError when the address is taken
    and :class:`MetricsAddressError` when it is not ``host:port``."""
    host, port = parse_address(address)
    if transport.insecure:
        listener = MetricsListener(_Server((host, port), registry, None, None))
        log.warning(
            "metrics served in PLAINTEXT to anyone at %s (GPUFLEET_INSECURE)",
            listener.url,
            extra={"fields": {"metrics_address": address}},
        )
        return listener
    server = _Server(
        (host, port), registry, _ServerContexts(transport.tls), ScrapeAuthority(transport.deployment)
    )
    listener = MetricsListener(server)
    log.info(
        "metrics served at %s to the deployment's metrics identity",
        listener.url,
        extra={"fields": {"metrics_address": address}},
    )
    return listener
