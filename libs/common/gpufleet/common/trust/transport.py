"""How one process speaks to the others: mutual TLS under the deployment's CA, or —
only when asked for by name, for development — plaintext.

A process builds one :class:`Transport` from its settings in ``main()`` and hands it to
its server and to every client it opens. A client names the part it expects to reach
(:class:`~gpufleet.common.trust.identity.Identity`), and the server's certificate must be
that part's: a scheduler that dials a machine's agent is answered by that machine.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import grpc

from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import TlsFiles

log = logging.getLogger(__name__)


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
            return cls(deployment, files)
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

    def server_credentials(self) -> grpc.ServerCredentials:
        """Serve TLS only, and only to callers with a certificate of this deployment."""
        assert self.files is not None
        ca, cert, key = self.files.read()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)

    @functools.cached_property
    def channel_credentials(self) -> grpc.ChannelCredentials:
        """This process's certificate and the deployment's trust bundle, read once (a
        process opens a channel per agent, and a prober one per probe). A channel a library
        opens itself (the OTLP exporter) checks the server's name with :meth:`server_name`
        through ``grpc.ssl_target_name_override``, as :meth:`channel` does."""
        if self.files is None:
            raise ValueError("an insecure transport has no credentials")
        ca, cert, key = self.files.read()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    def add_port(self, server: grpc.Server | grpc.aio.Server, address: str) -> int:
        if self.files is None:
            return server.add_insecure_port(address)
        return server.add_secure_port(address, self.server_credentials())

    def channel(
        self, address: str, server_name: str, options: list[tuple[str, object]] | None = None
    ) -> grpc.Channel:
        """A channel to ``address`` that only a server whose certificate carries
        ``server_name`` can answer (:meth:`server_name`)."""
        opts = list(options or [])
        if self.files is None:
            return grpc.insecure_channel(address, options=opts)
        opts.append(("grpc.ssl_target_name_override", server_name))
        return grpc.secure_channel(address, self.channel_credentials, options=opts)

    def server_name(self, role: Role, machine_id: str | None = None) -> str:
        """The name the server of ``role`` must prove; a machine's agent proves its own
        machine's (the caller names which machine it means to reach)."""
        if role is Role.MACHINE and machine_id is None:
            raise ValueError("an agent is dialled as one machine: name its machine_id")
        return Identity(role, self.deployment, machine_id).server_name
