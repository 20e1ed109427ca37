"""The deployment's CA folder and the identities its certificates carry."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509

from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.peer import identity_from_auth_context
from gpufleet.common.trust.pki import Authority, MachineIssuer, TlsFiles, issue_with, machine_ca_subject
from gpufleet.common.trust.transport import Transport


def auth_of(files: TlsFiles) -> dict[str, list[bytes]]:
    """What grpc's auth_context holds for a peer that presented this certificate."""
    leaf = files.cert.read_bytes().split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"
    return {"x509_pem_cert": [leaf]}


def test_the_ca_is_made_once_and_reused(tmp_path: Path) -> None:
    first = Authority.ensure(tmp_path / "tls", "local")
    ca = first.ca_path.read_bytes()
    again = Authority.ensure(tmp_path / "tls", "local")
    assert again.ca_path.read_bytes() == ca
    assert Authority.open(tmp_path / "tls").deployment == "local"
    for key in ("ca.key", "machine-ca.key"):
        assert stat.S_IMODE((tmp_path / "tls" / key).stat().st_mode) == 0o600


def test_a_ca_folder_of_another_deployment_is_refused(tmp_path: Path) -> None:
    Authority.ensure(tmp_path / "tls", "local")
    with pytest.raises(ValueError, match="deployment 'local'"):
        Authority.ensure(tmp_path / "tls", "prod")


@pytest.mark.parametrize("who", ["scheduler", "operator", "backend", "machine:m-7"])
def test_a_part_is_read_back_as_the_identity_it_was_issued(tmp_path: Path, who: str) -> None:
    authority = Authority.ensure(tmp_path / "tls", "local")
    identity = Identity.parse(who, "local")
    files = authority.ensure_part(identity)
    assert identity_from_auth_context(auth_of(files)) == identity
    assert stat.S_IMODE(files.key.stat().st_mode) == 0o600
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    # Its own name and no other: in particular no name every machine shares, so a caller
    # that dials one machine cannot be answered by another.
    assert names.get_values_for_type(x509.DNSName) == [identity.server_name, "localhost"]


def test_a_machine_signed_by_the_root_is_no_machine(tmp_path: Path) -> None:
    """Only the machine CA makes machines: a machine identity the root signed reads as none."""
    authority = Authority.ensure(tmp_path / "tls", "local")
    files = TlsFiles(authority.ca_path, tmp_path / "m.crt", tmp_path / "m.key")
    issue_with(
        authority.root(), authority.ca_path.read_bytes(), Identity(Role.MACHINE, "local", "m-1"), files
    )
    assert identity_from_auth_context(auth_of(files)) is None


def test_the_machine_ca_cannot_make_a_scheduler(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "tls", "local")
    files = TlsFiles(authority.ca_path, tmp_path / "s.crt", tmp_path / "s.key")
    issue_with(
        authority.machine_signer(), authority.ca_path.read_bytes(), Identity(Role.SCHEDULER, "local"), files
    )
    assert identity_from_auth_context(auth_of(files)) is None


def test_the_machine_issuer_holds_no_root_and_names_the_machine(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "tls", "dep")
    issuer = MachineIssuer.load(
        authority.ca_path, tmp_path / "tls" / "machine-ca.crt", tmp_path / "tls" / "machine-ca.key", "dep"
    )
    files = issuer.issue("m-9", tmp_path / "machine")
    assert identity_from_auth_context(auth_of(files)) == Identity(Role.MACHINE, "dep", "m-9")
    assert x509.load_pem_x509_certificate(files.cert.read_bytes()).issuer == machine_ca_subject("dep")
    with pytest.raises(ValueError, match="not the machine CA"):
        MachineIssuer.load(authority.ca_path, authority.ca_path, tmp_path / "tls" / "ca.key", "dep")


def test_no_certificate_is_no_identity() -> None:
    assert identity_from_auth_context({}) is None
    assert identity_from_auth_context({"x509_pem_cert": [b"not a certificate"]}) is None


@pytest.mark.parametrize(
    "uri",
    [
        "spiffe://gpufleet.local/root",
        "spiffe://gpufleet.local/machine/",
        "spiffe://gpufleet.local/machine/../etc",
        "spiffe://other.local/scheduler",
        "https://gpufleet.local/scheduler",
        "spiffe://gpufleet.local/scheduler/extra",
    ],
)
def test_uris_that_name_no_identity(uri: str) -> None:
    assert Identity.parse_uri(uri) is None


def test_an_agent_is_dialled_as_one_machine(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "tls", "dep")
    transport = Transport("dep", authority.ensure_part(Identity(Role.SCHEDULER, "dep")))
    assert transport.server_name(Role.MACHINE, "m-3") == "m-3.machine.gpufleet.dep"
    with pytest.raises(ValueError, match="machine_id"):
        transport.server_name(Role.MACHINE)
