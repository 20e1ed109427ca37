"""One part's TLS material as read from its files, checked whole before anything uses it.

A part's files change under it: a kubelet swaps a Secret's files in one atomic step, but
``gpufleet certs issue`` or an operator's copy replaces the key and the certificate one after
the other, and a file can be read half-written. Material is taken only when every file is
complete PEM and the key is the certificate's own; anything else is
:class:`IncompleteMaterial`, and the part goes on with what it had.
"""

from __future__ import annotations

import datetime
import hashlib
import re
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from gpufleet.common.trust.pki import TlsFiles

_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?\r?\n-----END \1-----", re.DOTALL)


class IncompleteMaterial(ValueError):
    """The files do not (yet) make a trust bundle, a certificate chain and its key."""


@dataclass(frozen=True)
class TlsMaterial:
    """A trust bundle, a certificate chain and the chain's key, known to belong together."""

    ca: bytes
    cert: bytes
    key: bytes
    leaf: x509.Certificate

    @property
    def not_after(self) -> datetime.datetime:
        return self.leaf.not_valid_after_utc

    @property
    def fingerprint(self) -> str:
        """The leaf's SHA-256, as ``openssl x509 -fingerprint -sha256`` prints it (for logs)."""
        digest = hashlib.sha256(self.leaf.public_bytes(serialization.Encoding.DER)).hexdigest()
        return digest.upper()

    def describe(self) -> str:
        return f"serial {self.leaf.serial_number:x}, valid until {self.not_after.isoformat()}"


def _whole_pem(name: str, data: bytes) -> int:
    """How many PEM blocks ``data`` holds, refusing a file that stops inside one: a bundle
    cut after its first certificate still parses, and would drop a trust root silently."""
    blocks = _BLOCK.findall(data)
    if not blocks:
        raise IncompleteMaterial(f"{name}: no complete PEM block")
    if data.count(b"-----BEGIN ") != len(blocks) or data.count(b"-----END ") != len(blocks):
        raise IncompleteMaterial(f"{name}: a PEM block is cut short")
    if data[data.rfind(b"-----END ") :].split(b"-----", 2)[2].strip():
        raise IncompleteMaterial(f"{name}: text after the last PEM block")
    return len(blocks)


def _certificates(name: str, data: bytes) -> list[x509.Certificate]:
    count = _whole_pem(name, data)
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise IncompleteMaterial(f"{name}: {exc}") from None
    if len(certs) != count:
        raise IncompleteMaterial(f"{name}: {count} PEM blocks but {len(certs)} certificates")
    return certs


def _private_key(name: str, data: bytes) -> PrivateKeyTypes:
    if _whole_pem(name, data) != 1:
        raise IncompleteMaterial(f"{name}: more than one PEM block")
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise IncompleteMaterial(f"{name}: {exc}") from None


def _spki(key: object) -> bytes:
    public_bytes = key.public_bytes  # type: ignore[attr-defined]
    return public_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def parse_material(ca: bytes, cert: bytes, key: bytes) -> TlsMaterial:
    """The material, or :class:`IncompleteMaterial` naming what is wrong."""
    _certificates("trust bundle", ca)
    leaf = _certificates("certificate", cert)[0]
    private = _private_key("key", key)
    if _spki(private.public_key()) != _spki(leaf.public_key()):
        raise IncompleteMaterial("the key is not the certificate's (one of the two is still the old one)")
    return TlsMaterial(ca, cert, key, leaf)


def read_material(files: TlsFiles) -> TlsMaterial:
    """The material in ``files`` now; a missing or unreadable file is incomplete too (a
    writer that removes before it writes)."""
    try:
        ca, cert, key = files.read()
    except OSError as exc:
        raise IncompleteMaterial(f"{exc.filename}: {exc.strerror}") from None
    return parse_material(ca, cert, key)
