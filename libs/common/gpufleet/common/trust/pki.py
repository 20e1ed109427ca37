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

Lifetimes and renewal: :mod:`gpufleet.common.trust.lifetimes`.

A leaf names only its own identity — its URI SAN and its one DNS name — and nothing every
part shares (no ``localhost``, no ``127.0.0.1``): a client that dials an address names the
part it means (``grpc.ssl_target_name_override``), and only that part can answer.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.lifetimes import (
    BACKDATE,
    CA_DAYS,
    MACHINE_CA_DAYS,
    Now,
    leaf_days,
    nearing_expiry,
    utc_now,
)

log = logging.getLogger(__name__)


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
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: Signer | None,
    path_length: int,
    days: int,
    now: datetime.datetime,
) -> x509.Certificate:
    sign_key = issuer.key if issuer else key
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.cert.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + datetime.timedelta(days=days))
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
    )
    if issuer is not None:
        # While a trust bundle holds an old root and its successor (same name), the key id
        # is how a verifier picks the one that signed this CA.
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer.key.public_key()), critical=False
        )
    return builder.sign(sign_key, hashes.SHA256())


class Authority:
    """A deployment's CA folder: creates what is missing, reuses what is there."""

    def __init__(self, folder: Path, deployment: str, now: Now = utc_now) -> None:
        self.folder = folder
        self.deployment = deployment
        self.now = now

    @property
    def ca_path(self) -> Path:
        return self.folder / "ca.crt"

    @classmethod
    def ensure(cls, folder: Path, deployment: str, now: Now = utc_now) -> Authority:
        """The CA in ``folder``, created on first use (root and machine CA); a machine CA
        nearing its expiry is renewed (a new key: machines issued by the old one keep its
        certificate in their chain, good until it expires)."""
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        stored = folder / "deployment"
        if stored.exists() and stored.read_text().strip() != deployment:
            raise ValueError(
                f"{folder} holds the CA of deployment {stored.read_text().strip()!r}, not {deployment!r}"
            )
        authority = cls(folder, deployment, now)
        if not authority.ca_path.exists():
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _ca_cert(root_subject(deployment), key, None, 1, CA_DAYS, now())
            _write(folder / "ca.key", _key_pem(key), private=True)
            _write(authority.ca_path, _cert_pem(cert), private=False)
        machine_ca = folder / "machine-ca.crt"
        if not machine_ca.exists() or authority._stale(
            x509.load_pem_x509_certificate(machine_ca.read_bytes())
        ):
            mkey = ec.generate_private_key(ec.SECP256R1())
            mcert = _ca_cert(
                machine_ca_subject(deployment), mkey, authority.root(), 0, MACHINE_CA_DAYS, now()
            )
            # The key first: a reader that finds the new key with the old certificate
            # refuses the pair and reads again (MachineIssuer, the reloader).
            _write(folder / "machine-ca.key", _key_pem(mkey), private=True)
            _write(machine_ca, _cert_pem(mcert), private=False)
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
        """The certificate of one part, issued into the folder the first time it is asked
        for, and again when it is due for renewal (:meth:`due`). A running part takes the
        new files without a restart."""
        files = self.files(name or str(identity).replace(":", "-"))
        if not self.due(identity, files):
            return files
        # Several processes may find it due at once (gpufleet up and a CLI command): one
        # issues, the others find it renewed — never one's key beside another's certificate.
        with _locked(self.folder / ".issue.lock"):
            reason = self.due(identity, files)
            if reason:
                if files.cert.exists():
                    log.info("renewing the certificate of %s: %s", identity, reason)
                self.issue(identity, files)
        return files

    def due(self, identity: Identity, files: TlsFiles) -> str:
        """Why ``files`` need a new certificate for ``identity`` ("" when they do not):
        none yet, nearing its expiry, not of this CA's key (the CA was replaced), or naming
        other names than the identity's own (issued by an older gpufleet, which added
        ``localhost``)."""
        if not (files.cert.exists() and files.key.exists()):
            return "none yet"
        try:
            cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
            key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
        except (ValueError, TypeError):
            return "unreadable"
        if _spki(key.public_key()) != _spki(cert.public_key()):
            return "its key is not its certificate's"
        if self._stale(cert):
            return f"it expires {cert.not_valid_after_utc.isoformat()}"
        signer = self.machine_signer() if identity.role is Role.MACHINE else self.root()
        try:
            aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
        except x509.ExtensionNotFound:
            aki = None
        expected = x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.key.public_key())
        if aki is None or aki.key_identifier != expected.key_identifier:
            return "signed by another key than this CA's"
        if _names(cert) != _names_of(identity):
            return "it names more than its own identity"
        return ""

    def _stale(self, cert: x509.Certificate) -> bool:
        return nearing_expiry(cert, self.now())

    def issue(self, identity: Identity, out: TlsFiles, days: int | None = None) -> TlsFiles:
        """Issue ``identity`` into ``out`` (overwriting), signed by the CA its role needs,
        for ``days`` (its role's default: :func:`leaf_days`)."""
        if identity.deployment != self.deployment:
            raise ValueError(f"{identity} is of deployment {identity.deployment}, not {self.deployment}")
        signer = self.machine_signer() if identity.role is Role.MACHINE else self.root()
        issue_with(signer, self.ca_path.read_bytes(), identity, out, days, self.now())
        return out


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _spki(public_key: object) -> bytes:
    public_bytes = public_key.public_bytes  # type: ignore[attr-defined]
    return public_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _names_of(identity: Identity) -> set[str]:
    return {identity.uri, *identity.server_names}


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(getattr(name, "value", name)) for name in san}


def issue_with(
    signer: Signer,
    ca_pem: bytes,
    identity: Identity,
    out: TlsFiles,
    days: int | None = None,
    now: datetime.datetime | None = None,
) -> None:
    """One leaf certificate for ``identity`` signed by ``signer``, its chain and key written
    to ``out`` (the trust bundle ``ca_pem`` beside them). A leaf is good for serving and for
    calling: every part does both. It never outlives its signer (a chain is only as good as
    its shortest link)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = now or utc_now()
    until = min(
        now + datetime.timedelta(days=days or leaf_days(identity.role)), signer.cert.not_valid_after_utc
    )
    names: list[x509.GeneralName] = [
        x509.UniformResourceIdentifier(identity.uri),
        *(x509.DNSName(name) for name in identity.server_names),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, str(identity))]))
        .issuer_name(signer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(until)
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


class MachineIssuer:
    """What gives a new machine its credential: the machine CA and the trust bundle,
    never the root (held by the provisioner's drivers and ``gpufleet certs issue``).

    Loaded from files, it follows them: each issue reads them again (machines are made
    seldom), so a renewed machine CA or trust bundle is what the next machine gets, with no
    restart; files caught mid-change (a key that is not the certificate's) leave the
    previous ones in use."""

    def __init__(
        self, signer: Signer, ca_pem: bytes, deployment: str, paths: tuple[Path, Path, Path] | None = None
    ) -> None:
        self.signer = signer
        self.ca_pem = ca_pem
        self.deployment = deployment
        self._paths = paths

    @classmethod
    def load(cls, ca: Path, cert: Path, key: Path, deployment: str) -> MachineIssuer:
        signer, ca_pem = _machine_ca(ca, cert, key, deployment)
        return cls(signer, ca_pem, deployment, (ca, cert, key))

    def _refresh(self) -> None:
        if self._paths is None:
            return
        try:
            signer, ca_pem = _machine_ca(*self._paths, self.deployment)
        except (OSError, ValueError) as exc:
            log.warning("machine CA files not whole now (%s): issuing with the ones read before", exc)
            return
        if signer.cert != self.signer.cert or ca_pem != self.ca_pem:
            log.info(
                "machine CA files changed: new machines get serial %x, valid until %s",
                signer.cert.serial_number,
                signer.cert.not_valid_after_utc.isoformat(),
            )
        self.signer, self.ca_pem = signer, ca_pem

    def issue(self, machine_id: str, folder: Path, days: int | None = None) -> TlsFiles:
        """The machine's certificate in ``folder`` (``ca.crt``, ``machine.crt``, ``machine.key``)."""
        self._refresh()
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        out = TlsFiles(folder / "ca.crt", folder / "machine.crt", folder / "machine.key")
        issue_with(self.signer, self.ca_pem, Identity(Role.MACHINE, self.deployment, machine_id), out, days)
        return out


def _machine_ca(ca: Path, cert: Path, key: Path, deployment: str) -> tuple[Signer, bytes]:
    signer = Signer.load(cert, key)
    if signer.cert.subject != machine_ca_subject(deployment):
        raise ValueError(f"{cert} is not the machine CA of deployment {deployment}")
    if _spki(signer.key.public_key()) != _spki(signer.cert.public_key()):
        raise ValueError(f"{key} is not the key of {cert}")
    return signer, ca.read_bytes()


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
