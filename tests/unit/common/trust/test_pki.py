"""The deployment's CA folder and the identities its certificates carry."""

from __future__ import annotations

import datetime
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.peer import identity_from_auth_context
from gpufleet.common.trust.pki import (
    BACKDATE,
    Authority,
    MachineIssuer,
    TlsFiles,
    issue_with,
    machine_ca_subject,
)
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
    # Its own name and no other: no name every machine shares, so a caller that dials one
    # machine cannot be answered by another; no localhost nor 127.0.0.1, which every part
    # reached on one host would answer to.
    assert names.get_values_for_type(x509.DNSName) == [identity.server_name]
    assert names.get_values_for_type(x509.UniformResourceIdentifier) == [identity.uri]
    assert names.get_values_for_type(x509.IPAddress) == []
    assert len(list(names)) == 2


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


# ---- lifetimes and renewal -------------------------------------------------------------------

DAY = datetime.timedelta(days=1)


def life_of(files: TlsFiles) -> tuple[datetime.datetime, datetime.datetime]:
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    return cert.not_valid_before_utc, cert.not_valid_after_utc


@pytest.mark.parametrize(("who", "days"), [("scheduler", 30), ("operator", 30), ("machine:m-1", 90)])
def test_a_new_certificate_is_short_lived(tmp_path: Path, who: str, days: int) -> None:
    files = Authority.ensure(tmp_path / "tls", "local").ensure_part(Identity.parse(who, "local"))
    start, end = life_of(files)
    assert end - start == datetime.timedelta(days=days) + BACKDATE


def test_gpufleet_up_renews_a_certificate_nearing_its_expiry_and_keeps_one_that_is_not(
    tmp_path: Path,
) -> None:
    """What `gpufleet up` does at each start (Authority.ensure_part for every part)."""
    issued_at = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    clock = [issued_at]
    authority = Authority.ensure(tmp_path / "tls", "local", now=lambda: clock[0])
    files = authority.ensure_part(Identity(Role.REAPER, "local"))
    first = files.cert.read_bytes()

    clock[0] = issued_at + 19 * DAY  # eleven days left of thirty: more than a third
    assert authority.ensure_part(Identity(Role.REAPER, "local")).cert.read_bytes() == first
    clock[0] = issued_at + 21 * DAY  # nine left: renewed
    authority.ensure_part(Identity(Role.REAPER, "local"))
    assert files.cert.read_bytes() != first
    assert life_of(files)[1] == clock[0] + 30 * DAY


def test_a_certificate_with_the_old_localhost_names_is_issued_again(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "tls", "local")
    identity = Identity(Role.SCHEDULER, "local")
    files = authority.files("scheduler")
    root = authority.root()
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    old = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "scheduler")]))
        .issuer_name(root.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + 397 * DAY)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.UniformResourceIdentifier(identity.uri),
                    x509.DNSName(identity.server_name),
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(root.key.public_key()), critical=False
        )
        .sign(root.key, hashes.SHA256())
    )
    files.cert.write_bytes(old.public_bytes(serialization.Encoding.PEM))
    files.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    assert authority.due(identity, files) == "it names more than its own identity"
    authority.ensure_part(identity)
    assert authority.due(identity, files) == ""
    names = x509.load_pem_x509_certificate(files.cert.read_bytes()).extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert names.value.get_values_for_type(x509.IPAddress) == []


def test_a_certificate_of_a_replaced_ca_is_issued_again(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "tls", "local")
    files = authority.ensure_part(Identity(Role.SWEEPER, "local"))
    fresh = Authority.ensure(tmp_path / "new", "local")
    for name in ("ca.crt", "ca.key", "machine-ca.crt", "machine-ca.key"):
        (tmp_path / "tls" / name).write_bytes((fresh.folder / name).read_bytes())
    assert authority.due(Identity(Role.SWEEPER, "local"), files) == "signed by another key than this CA's"
    authority.ensure_part(Identity(Role.SWEEPER, "local"))
    assert files.ca.read_bytes() == fresh.ca_path.read_bytes()
    assert authority.due(Identity(Role.SWEEPER, "local"), files) == ""


def test_the_machine_ca_is_renewed_before_it_expires_and_no_machine_outlives_it(tmp_path: Path) -> None:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    authority = Authority.ensure(tmp_path / "tls", "dep", now=lambda: start)
    first = (tmp_path / "tls" / "machine-ca.crt").read_bytes()
    machine_ca_end = x509.load_pem_x509_certificate(first).not_valid_after_utc
    assert machine_ca_end == start + 365 * DAY
    # Issued 300 days in: 65 days of the machine CA left, less than a machine's 90.
    late = Authority(authority.folder, "dep", now=lambda: start + 300 * DAY)
    files = late.issue(
        Identity(Role.MACHINE, "dep", "m-1"),
        TlsFiles(authority.ca_path, tmp_path / "m.crt", tmp_path / "m.key"),
    )
    assert life_of(files)[1] == machine_ca_end

    Authority.ensure(tmp_path / "tls", "dep", now=lambda: start + 240 * DAY)  # 125 days left: kept
    assert (tmp_path / "tls" / "machine-ca.crt").read_bytes() == first
    Authority.ensure(tmp_path / "tls", "dep", now=lambda: start + 245 * DAY)  # 120: under a third
    assert (tmp_path / "tls" / "machine-ca.crt").read_bytes() != first


def test_the_machine_issuer_follows_a_renewed_machine_ca(tmp_path: Path) -> None:
    authority = Authority.ensure(tmp_path / "tls", "dep")
    folder = tmp_path / "tls"
    issuer = MachineIssuer.load(
        authority.ca_path, folder / "machine-ca.crt", folder / "machine-ca.key", "dep"
    )
    before = x509.load_pem_x509_certificate(issuer.issue("m-1", tmp_path / "a").cert.read_bytes())

    later = datetime.datetime.now(datetime.UTC) + 300 * DAY
    Authority.ensure(folder, "dep", now=lambda: later)  # a new machine CA, written in place
    renewed = x509.load_pem_x509_certificate((folder / "machine-ca.crt").read_bytes())
    after = x509.load_pem_x509_certificate(issuer.issue("m-2", tmp_path / "b").cert.read_bytes())
    aki = after.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    assert aki == x509.SubjectKeyIdentifier.from_public_key(renewed.public_key()).digest
    assert before.issuer == after.issuer == machine_ca_subject("dep")

    # Caught half-way (a new key beside the old certificate): the last whole pair is used.
    other = Authority.ensure(tmp_path / "other", "dep")
    (folder / "machine-ca.key").write_bytes((other.folder / "machine-ca.key").read_bytes())
    third = x509.load_pem_x509_certificate(issuer.issue("m-3", tmp_path / "c").cert.read_bytes())
    aki = third.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value.key_identifier
    assert aki == x509.SubjectKeyIdentifier.from_public_key(renewed.public_key()).digest
