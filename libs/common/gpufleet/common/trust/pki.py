"""The deployment's own certificate authority, kept in a folder.

Two signing keys: the root signs every service's certificate and the machine CA; the
machine CA signs only machines' certificates. Whoever must give machines their
credentials (the provisioner's drivers, an operator registering a box) holds the machine
CA's key and never the root's, and the authorization layer accepts a machine identity
only from a certificate the machine CA signed — so a stolen machine-issuing key can mint
machines, never a scheduler or an operator.

The folder's layout (``gpufleet up`` keeps it under ``<state dir>/tls``)::

    ca.crt  ca.key                 the root (the trust bundle every part verifies against)
    machine-ca.crt  machine-ca.key the machine CA
    <name>.crt  <name>.key         a part's certificate (with its chain) and key
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufleet.common.trust.identity import Identity, Role

CA_DAYS = 3650
LEAF_DAYS = 397
# Clocks of parts disagree a little; a certificate valid "from now" must not be refused
# by a peer whose clock is a minute behind.
BACKDATE = datetime.timedelta(minutes=5)


def root_subject(deployment: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpufleet {deployment} root CA")])


def machine_ca_subject(deployment: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpufleet {deployment} machine CA")])


@dataclass(frozen=True)
class TlsFiles:
    """Where one part finds its trust bundle, its certificate chain and its key."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()


def _write(path: Path, data: bytes, private: bool) -> None:
    """Written whole or not at all; a key is never readable by anyone else, even briefly."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Signer:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def load(cls, cert_path: Path, key_path: Path) -> Signer:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: not an EC key")
        return cls(cert, key)


def _ca_cert(
    subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: Signer | None, path_length: int
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    sign_key = issuer.key if issuer else key
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(sign_key, hashes.SHA256())
    )


class Authority:
    """A deployment's CA folder: creates what is missing, reuses what is there."""

    def __init__(self, folder: Path, deployment: str) -> None:
        self.folder = folder
        self.deployment = deployment

    @property
    def ca_path(self) -> Path:
        return self.folder / "ca.crt"

    @classmethod
    def ensure(cls, folder: Path, deployment: str) -> Authority:
        """The CA in ``folder``, created on first use (root and machine CA)."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        stored = folder / "deployment"
        if stored.exists() and stored.read_text().strip() != deployment:
            raise ValueError(
                f"{folder} holds the CA of deployment {stored.read_text().strip()!r}, not {deployment!r}"
            )
        authority = cls(folder, deployment)
        if not authority.ca_path.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _ca_cert(root_subject(deployment), key, None, path_length=1)
            _write(folder / "ca.key", _key_pem(key), private=True)
            _write(authority.ca_path, _cert_pem(cert), private=False)
        if not (folder / "machine-ca.crt").exists():
            mkey = ec.generate_private_key(ec.SECP256R1())
            mcert = _ca_cert(machine_ca_subject(deployment), mkey, authority.root(), path_length=0)
            _write(folder / "machine-ca.key", _key_pem(mkey), private=True)
            _write(folder / "machine-ca.crt", _cert_pem(mcert), private=False)
        if not stored.exists():
            _write(stored, f"{deployment}\n".encode(), private=False)
        return authority

    @classmethod
    def open(cls, folder: Path) -> Authority:
        """An existing CA folder (its deployment read from it)."""
        stored = folder / "deployment"
        if not (folder / "ca.crt").exists() or not stored.exists():
            raise FileNotFoundError(f"no gpufleet CA in {folder}")
        return cls(folder, stored.read_text().strip())

    def root(self) -> Signer:
        return Signer.load(self.ca_path, self.folder / "ca.key")

    def machine_signer(self) -> Signer:
        return Signer.load(self.folder / "machine-ca.crt", self.folder / "machine-ca.key")

    def files(self, name: str) -> TlsFiles:
        return TlsFiles(self.ca_path, self.folder / f"{name}.crt", self.folder / f"{name}.key")

    def ensure_part(self, identity: Identity, name: str | None = None) -> TlsFiles:
        """The certificate of one part, issued into the folder the first time it is asked for."""
        files = self.files(name or str(identity).replace(":", "-"))
        if not (files.cert.exists() and files.key.exists()):
            self.issue(identity, files)
        return files

    def issue(self, identity: Identity, out: TlsFiles, days: int = LEAF_DAYS) -> TlsFiles:
        """Issue ``identity`` into ``out`` (overwriting), signed by the CA its role needs."""
        if identity.deployment != self.deployment:
            raise ValueError(f"{identity} is of deployment {identity.deployment}, not {self.deployment}")
        signer = self.machine_signer() if identity.role is Role.MACHINE else self.root()
        issue_with(signer, self.ca_path.read_bytes(), identity, out, days)
        return out


def issue_with(
    signer: Signer, ca_pem: bytes, identity: Identity, out: TlsFiles, days: int = LEAF_DAYS
) -> None:
    """One leaf certificate for ``identity`` signed by ``signer``, its chain and key written
    to ``out`` (the trust bundle ``ca_pem`` beside them). A leaf is good for serving and for
    calling: every part does both."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(identity.uri),
        *(x509.DNSName(name) for name in identity.server_names),
        # Reached by address on one host (gpufleet up, tests): the name check is done on
        # server_name, but a client that dials an IP without an override still verifies.
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(identity))]))
        .issuer_name(signer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.key.public_key()), critical=False
        )
        .sign(signer.key, hashes.SHA256())
    )
    chain = _cert_pem(cert)
    if signer.cert.subject != signer.cert.issuer:  # an intermediate: the peer needs it to build the path
        chain += _cert_pem(signer.cert)
    out.cert.parent.mkdir(parents=True, exist_ok=True)
    _write(out.key, _key_pem(key), private=True)
    _write(out.cert, chain, private=False)
    if not out.ca.exists() or out.ca.read_bytes() != ca_pem:
        _write(out.ca, ca_pem, private=False)


@dataclass(frozen=True)
class MachineIssuer:
    """What gives a new machine its credential: the machine CA and the trust bundle,
    never the root (held by the provisioner's drivers and ``gpufleet certs issue``)."""

    signer: Signer
    ca_pem: bytes
    deployment: str

    @classmethod
    def load(cls, ca: Path, cert: Path, key: Path, deployment: str) -> MachineIssuer:
        signer = Signer.load(cert, key)
        if signer.cert.subject != machine_ca_subject(deployment):
            raise ValueError(f"{cert} is not the machine CA of deployment {deployment}")
        return cls(signer, ca.read_bytes(), deployment)

    def issue(self, machine_id: str, folder: Path, days: int = LEAF_DAYS) -> TlsFiles:
        """The machine's certificate in ``folder`` (``ca.crt``, ``machine.crt``, ``machine.key``)."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        out = TlsFiles(folder / "ca.crt", folder / "machine.crt", folder / "machine.key")
        issue_with(self.signer, self.ca_pem, Identity(Role.MACHINE, self.deployment, machine_id), out, days)
        return out


def machine_credential(issuer: MachineIssuer | None, machine_id: str) -> dict[str, str]:
    """A new machine's credential for a cloud driver to hand to that instance alone, as
    PEM text: ``tls-ca``, ``tls-cert`` (with its chain) and ``tls-key``; empty without an
    issuer (a development provisioner run insecure). The machine's image writes them to
    files and points ``GPUFLEET_TLS_*`` at them before its agent starts."""
    if issuer is None:
        return {}
    with tempfile.TemporaryDirectory() as folder:
        files = issuer.issue(machine_id, Path(folder))
        ca, cert, key = files.read()
    return {"tls-ca": ca.decode(), "tls-cert": cert.decode(), "tls-key": key.decode()}
