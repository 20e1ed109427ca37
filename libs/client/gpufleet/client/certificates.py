"""Mutual TLS from a certificate folder, checked the way gpufleet's own parts check it.

``gpufleet certs issue --role backend --out DIR`` writes ``ca.crt`` (the deployment's trust
bundle), ``tls.crt`` (the client's certificate with its chain) and ``tls.key``. The
scheduler's serving certificate names it ``scheduler.gpufleet.<deployment>``; the client
checks that name whatever address it dials (an IP, a load balancer's name), so only the
deployment's scheduler can answer — not another part of it, nor another deployment's
scheduler reached by mistake. The deployment id is read from the client's own certificate
(its URI SAN ``spiffe://gpufleet.<deployment>/<role>``) unless it is given.

The folder is followed, not read once (:class:`CertificateWatch`): certificates are
short-lived (30 days for a backend's) and renewed in place — by ``gpufleet certs issue``
again, by cert-manager or a Job through a Secret the kubelet swaps — and a long-running
backend keeps its client. The files are taken only when they are whole: complete PEM, the
key the certificate's own (a writer replaces the key and the certificate one after the
other), and the same deployment's.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

FILES = ("ca.crt", "tls.crt", "tls.key")
_SPIFFE_PREFIX = "spiffe://gpufleet."
_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?\r?\n-----END \1-----", re.DOTALL)
# How often, at most, a client looks at its files again (real seconds: how soon a renewed
# certificate is seen, no deadline of the logic). A look is three stat() calls; the files are
# read only when one of them changed.
CHECK_EVERY_S = 1.0

log = logging.getLogger("gpufleet.client")


class IncompleteCertificates(ValueError):
    """The files do not (yet) make a trust bundle, a certificate chain and its key."""


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
        return cls.parse(ca, cert, key, path, deployment)

    @classmethod
    def parse(
        cls, ca: bytes, cert: bytes, key: bytes, where: Path, deployment: str | None = None
    ) -> CertificateFolder:
        """The folder's content checked whole: :class:`IncompleteCertificates` (a
        ValueError) names what is cut short or does not belong together."""
        _certificates(where / "ca.crt", ca)
        leaf = _certificates(where / "tls.crt", cert)[0]
        found_deployment, role = identity_of(cert, where / "tls.crt")
        private = _private_key(where / "tls.key", key)
        if _spki(private.public_key()) != _spki(leaf.public_key()):
            raise IncompleteCertificates(
                f"{where}: tls.key is not the key of tls.crt (one of the two is still the old one)"
            )
        return cls(ca, cert, key, deployment or found_deployment, role)

    @property
    def serial(self) -> int:
        """The serial number of the client's own certificate."""
        return x509.load_pem_x509_certificate(self.cert).serial_number

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


def _pem_blocks(where: Path, data: bytes) -> int:
    """How many PEM blocks ``data`` holds, refusing a file that stops inside one (a bundle
    cut after its first certificate still parses, and would drop a trust root silently)."""
    count = len(_BLOCK.findall(data))
    if not count:
        raise IncompleteCertificates(f"{where}: no complete PEM block")
    if data.count(b"-----BEGIN ") != count or data.count(b"-----END ") != count:
        raise IncompleteCertificates(f"{where}: a PEM block is cut short")
    if data[data.rfind(b"-----END ") :].split(b"-----", 2)[2].strip():
        raise IncompleteCertificates(f"{where}: text after the last PEM block")
    return count


def _certificates(where: Path, data: bytes) -> list[x509.Certificate]:
    _pem_blocks(where, data)
    try:
        return [x509.load_pem_x509_certificate(m.group(0)) for m in _BLOCK.finditer(data)]
    except ValueError as exc:
        raise IncompleteCertificates(f"{where}: {exc}") from None


def _private_key(where: Path, data: bytes) -> Any:
    if _pem_blocks(where, data) != 1:
        raise IncompleteCertificates(f"{where}: more than one PEM block")
    try:
        return serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise IncompleteCertificates(f"{where}: {exc}") from None


def _spki(key: object) -> bytes:
    public_bytes = key.public_bytes  # type: ignore[attr-defined]
    return public_bytes(  # type: ignore[no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


_Stamp = tuple[tuple[int, int, int, int, int], ...]


class CertificateWatch:
    """A certificate folder followed as its files change: the newest whole content.

    Nothing runs on a timer: whoever is about to open a channel asks :meth:`current`, which
    looks at the files (``stat``, through symlinks: a kubelet swaps a Secret's files by
    renaming its ``..data`` link) at most once per ``check_every_s`` and reads them only
    when one changed. Content that is not whole yet is logged once and left until the
    files change again; the client goes on with what it had. Thread-safe.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        deployment: str | None = None,
        *,
        check_every_s: float = CHECK_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Reads the folder now, raising what :meth:`CertificateFolder.read` raises."""
        self.path = Path(path)
        self._deployment = deployment
        self._check_every_s = check_every_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        try:
            self._stamp: _Stamp | None = self._stat()  # before the read: a change after it is seen
        except OSError:
            self._stamp = None
        self._folder = CertificateFolder.read(self.path, deployment)
        self._seen = (self._folder.ca, self._folder.cert, self._folder.key)
        self._refused: tuple[bytes, bytes, bytes] | None = None
        self._next_check = monotonic() + check_every_s
        # How many times new content was taken.
        self.changes = 0

    def current(self) -> CertificateFolder:
        """The content to open a channel with now, looked at again once ``check_every_s``
        has passed."""
        if self._monotonic() >= self._next_check:
            self._check(only_when_due=True)
        return self._folder

    def check(self) -> bool:
        """Look at the files now; True when they changed and the new content was taken."""
        return self._check(only_when_due=False)

    def _stat(self) -> _Stamp:
        stamps = []
        for name in FILES:
            st = os.stat(self.path / name)
            stamps.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return tuple(stamps)

    def _check(self, only_when_due: bool) -> bool:
        with self._lock:
            now = self._monotonic()
            if only_when_due and now < self._next_check:
                return False  # another caller has just looked
            self._next_check = now + self._check_every_s
            try:
                stamp = self._stat()
                if stamp == self._stamp:
                    return False
                ca, cert, key = ((self.path / name).read_bytes() for name in FILES)
            except OSError as exc:
                log.debug("%s: not readable now (%s): keeping the current certificate", exc.filename, exc)
                return False
            # Stamped before the read: a write that lands after it changes the stamp again.
            self._stamp = stamp
            raw = (ca, cert, key)
            if raw == self._seen or raw == self._refused:
                return False
            previous = self._folder
            try:
                folder = CertificateFolder.parse(ca, cert, key, self.path, self._deployment)
                if folder.server_name != previous.server_name:
                    raise IncompleteCertificates(
                        f"{self.path}: the new certificate is of deployment {folder.deployment}, "
                        f"not {previous.deployment} (make a new client to change deployments)"
                    )
            except ValueError as exc:
                # Said once for each content; the next change (the writer finishing) is read.
                self._refused = raw
                log.warning(
                    "certificate files changed but not taken (%s): still using serial %x",
                    exc,
                    previous.serial,
                )
                return False
            self._folder, self._seen, self._refused = folder, raw, None
            self.changes += 1
        log.info(
            "certificate files in %s changed: new connections use serial %x (was %x)%s",
            self.path,
            folder.serial,
            previous.serial,
            "; the trust bundle changed too" if folder.ca != previous.ca else "",
        )
        return True
