"""Mutual TLS from a certificate folder, checked the way gpufleet's own parts check it.

``gpufleet certs issue --role backend --out DIR`` writes ``ca.crt`` (the deployment's trust
bundle), ``tls.crt`` (the client's certificate with its chain) and ``tls.key``. The
scheduler's serving certificate names it ``scheduler.gpufleet.<deployment>``; the client
checks that name whatever address it dials (an IP, a load balancer's name), so only the
deployment's scheduler can answer — not another part of it, nor another deployment's
scheduler reached by mistake. The deployment id is read from the client's own certificate
(its URI SAN ``spiffe://gpufleet.<deployment>/<role>``) unless it is given.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509

FILES = ("ca.crt", "tls.crt", "tls.key")
_SPIFFE_PREFIX = "spiffe://gpufleet."


@dataclass(frozen=True)
class CertificateFolder:
    """The three files of one client certificate and the deployment they belong to."""

    ca: bytes
    cert: bytes
    key: bytes
    deployment: str
    # The role the certificate proves (backend, operator), as its URI SAN names it.
    role: str

    @classmethod
    def read(cls, folder: str | os.PathLike[str], deployment: str | None = None) -> CertificateFolder:
        """Read ``folder``; a missing file is named in the error, as is a certificate that
        is not one of a gpufleet deployment."""
        path = Path(folder)
        missing = [name for name in FILES if not (path / name).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{path}: missing {', '.join(missing)} (`gpufleet certs issue --role backend "
                f"--out {path}` writes {', '.join(FILES)})"
            )
        ca, cert, key = ((path / name).read_bytes() for name in FILES)
        found_deployment, role = identity_of(cert, path / "tls.crt")
        return cls(ca, cert, key, deployment or found_deployment, role)

    @property
    def server_name(self) -> str:
        """The name the scheduler's certificate must carry."""
        return f"scheduler.gpufleet.{self.deployment}"

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )


def identity_of(cert_pem: bytes, where: Path) -> tuple[str, str]:
    """(deployment, role) from the first certificate of a PEM chain."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        names = None
    for uri in names.get_values_for_type(x509.UniformResourceIdentifier) if names else ():
        if uri.startswith(_SPIFFE_PREFIX):
            deployment, _, role = uri[len(_SPIFFE_PREFIX) :].partition("/")
            if deployment and role:
                return deployment, role
    raise ValueError(f"{where}: not a gpufleet certificate (no spiffe://gpufleet.<deployment>/<role> name)")
