"""A certificate folder as `gpufleet certs issue` writes it: the deployment and role read
from the certificate, the scheduler's name derived from them, a missing file named."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufleet.client.certificates import CertificateFolder
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority, TlsFiles


def issued(tmp_path: Path, role: Role, deployment: str = "prod-eu") -> Path:
    authority = Authority.ensure(tmp_path / "ca", deployment)
    out = tmp_path / str(role)
    authority.issue(Identity(role, deployment), TlsFiles(out / "ca.crt", out / "tls.crt", out / "tls.key"))
    return out


def test_the_deployment_and_role_come_from_the_certificate(tmp_path: Path) -> None:
    folder = CertificateFolder.read(issued(tmp_path, Role.BACKEND))
    assert (folder.deployment, folder.role, folder.server_name) == (
        "prod-eu",
        "backend",
        "scheduler.gpufleet.prod-eu",
    )
    named = CertificateFolder.read(issued(tmp_path, Role.OPERATOR), deployment="other")
    assert (named.role, named.server_name) == ("operator", "scheduler.gpufleet.other")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    folder = issued(tmp_path, Role.BACKEND)
    (folder / "tls.key").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing tls\.key .*gpufleet certs issue"):
        CertificateFolder.read(folder)


def test_a_certificate_of_no_deployment_is_refused(tmp_path: Path) -> None:
    folder = issued(tmp_path, Role.BACKEND)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "someone")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("someone.example")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    (folder / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    with pytest.raises(ValueError, match="not a gpufleet certificate"):
        CertificateFolder.read(folder)
