"""How one process speaks to the others: mutual TLS under the deployment's CA, or —
only when asked for by name, for development — plaintext.

A process builds one :class:`Transport` from its settings in ``main()`` and hands it to
its server and to every client it opens. A client names the part it expects to reach
(:class:`~gpufleet.common.trust.identity.Identity`), and the server's certificate must be
that part's: a scheduler that dials a machine's agent is answered by that machine.

The files are followed, not read once (:mod:`gpufleet.common.trust.reload`): a renewed
certificate, key or trust bundle is what the server hands the next connection and what the
next client connection is opened with; calls already going on keep their connection.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.material import IncompleteMaterial, TlsMaterial
from gpufleet.common.trust.pki import TlsFiles
from gpufleet.common.trust.reload import TlsReloader, reloader_for
from gpufleet.common.trust.reloading_channel import ReloadingChannel, channel_credentials

log = logging.getLogger(__name__)


# Every channel dials again within seconds once its server is back. gRPC's default
# reconnect back-off grows to 120 s; after a control-plane restart of a minute a machine's
# worker could then wait that long to report — past its attempts' lease fence (half of a
# 90 s lease), which would stop every job it runs although nothing was wrong.
RECONNECT_BACKOFF: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 1000),
    ("grpc.max_reconnect_backoff_ms", 5000),
)


class TransportNotConfigured(RuntimeError):
    """Neither TLS files nor the explicit insecure flag: the process must not start."""


@dataclass(frozen=True)
class Transport:
    deployment: str
    files: TlsFiles | None  # None: plaintext, for local development only

    @property
    def insecure(self) -> bool:
        return self.files is None

    @classmethod
    def from_paths(
        cls,
        deployment: str,
        ca: str | None,
        cert: str | None,
        key: str | None,
        insecure: bool,
        who: str,
    ) -> Transport:
        """The transport settings ask for; refuses the silent middle ground (some files
        set, or none and no insecure flag)."""
        given = [p for p in (ca, cert, key) if p]
        if ca and cert and key:
            files = TlsFiles(Path(ca), Path(cert), Path(key))
            missing = [str(p) for p in (files.ca, files.cert, files.key) if not p.is_file()]
            if missing:
                raise TransportNotConfigured(f"{who}: TLS file(s) not found: {', '.join(missing)}")
            transport = cls(deployment, files)
            try:
                transport.tls  # noqa: B018 - read now: a process does not start on files that are not whole
            except IncompleteMaterial as exc:
                raise TransportNotConfigured(
                    f"{who}: GPUFLEET_TLS_CA_FILE, GPUFLEET_TLS_CERT_FILE and GPUFLEET_TLS_KEY_FILE do not "
                    f"make a trust bundle, a certificate and its key: {exc}"
                ) from None
            return transport
        if given:
            raise TransportNotConfigured(
                f"{who}: GPUFLEET_TLS_CA_FILE, GPUFLEET_TLS_CERT_FILE and GPUFLEET_TLS_KEY_FILE "
                "must be set together"
            )
        if not insecure:
            raise TransportNotConfigured(
                f"{who}: no TLS configured. Set GPUFLEET_TLS_CA_FILE, GPUFLEET_TLS_CERT_FILE and "
                "GPUFLEET_TLS_KEY_FILE (gpufleet up makes them in its state dir; "
                "`gpufleet certs issue` writes one), or set GPUFLEET_INSECURE=true for local "
                "development only: then every connection is plaintext and unauthenticated"
            )
        return cls(deployment, None)

    @functools.cached_property
    def tls(self) -> TlsReloader:
        """This process's material, followed as its files change (one reader for the
        process's server, its clients and its metrics listener)."""
        if self.files is None:
            raise ValueError("an insecure transport has no certificate")
        return reloader_for(self.files)

    def server_credentials(self) -> grpc.ServerCredentials:
        """Serve TLS only, and only to callers with a certificate of this deployment; each
        new connection gets the certificate and trust bundle in force when it comes
        (gRPC asks the fetcher at every handshake; connections already made keep theirs)."""
        reloader = self.tls
        served = [reloader.current()]

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            # Called by gRPC's core at each handshake: None keeps what it has.
            material = reloader.current()
            if material is served[0]:
                return None
            served[0] = material
            return _server_configuration(material)

        return grpc.dynamic_ssl_server_credentials(
            _server_configuration(served[0]),
            fetch,  # type: ignore[arg-type]  # grpc-stubs leave out the None that grpcio takes
            require_client_authentication=True,
        )

    @property
    def channel_credentials(self) -> grpc.ChannelCredentials:
        """This process's certificate and the deployment's trust bundle as they are now,
        for a channel a library opens itself (the OTLP exporter), which checks the server's
        name with :meth:`server_name` through ``grpc.ssl_target_name_override``. Such a
        channel keeps these for its life; :meth:`channel` follows the files."""
        return channel_credentials(self.tls.current())

    def add_port(self, server: grpc.Server | grpc.aio.Server, address: str) -> int:
        if self.files is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, self.server_credentials())

    def channel(
        self, address: str, server_name: str, options: list[tuple[str, object]] | None = None
    ) -> grpc.Channel:
        """A channel to ``address`` that only a server whose certificate carries
        ``server_name`` can answer (:meth:`server_name`); its new connections are made
        with the certificate in force (:class:`ReloadingChannel`)."""
        given = list(options or [])
        named = {name for name, _ in given}
        opts = [*given, *((n, v) for n, v in RECONNECT_BACKOFF if n not in named)]
        if self.files is None:
            return grpc.insecure_channel(address, options=opts)
        return ReloadingChannel(address, server_name, opts, self.tls)

    def server_name(self, role: Role, machine_id: str | None = None) -> str:
        """The name the server of ``role`` must prove; a machine's agent proves its own
        machine's (the caller names which machine it means to reach)."""
        if role is Role.MACHINE and machine_id is None:
            raise ValueError("an agent is dialled as one machine: name its machine_id")
        return Identity(role, self.deployment, machine_id).server_name


def _server_configuration(material: TlsMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(material.key, material.cert)], root_certificates=material.ca
    )
