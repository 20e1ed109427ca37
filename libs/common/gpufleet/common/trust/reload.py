"""A part's certificate, key and trust bundle, followed as their files change.

Certificates are short-lived and replaced in place: cert-manager or the certs Job renews a
Secret and the kubelet swaps the mounted files (a new timestamped folder, then the
``..data`` symlink renamed over the old one); ``gpufleet up`` re-issues a part's files at
start. A process keeps running across that: its server hands new connections the new
certificate, its clients open new connections with it, and the calls already going on keep
their connection.

Nothing here runs on a timer of its own. Whoever is about to use the material — a server
about to handshake, a client about to call, the metrics listener accepting a scrape — asks
:meth:`TlsReloader.current`, which reads the files again at most once per ``check_every_s``
(real seconds: how soon a change is seen, not a deadline of the logic) and takes them only
when they are whole (:mod:`gpufleet.common.trust.material`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpufleet.common.trust.material import IncompleteMaterial, TlsMaterial, parse_material, read_material
from gpufleet.common.trust.pki import TlsFiles

log = logging.getLogger(__name__)

# A kubelet takes up to a minute or so to project a renewed Secret; seconds more is nothing,
# and reading three small files once a second is nothing either.
CHECK_EVERY_S = 1.0


class TlsReloader:
    """The newest whole material of one set of files. Thread-safe."""

    def __init__(
        self,
        files: TlsFiles,
        *,
        check_every_s: float = CHECK_EVERY_S,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """Reads the files now: raises :class:`IncompleteMaterial` when they do not make a
        certificate and its key (a process must not start on them)."""
        self.files = files
        self._check_every_s = check_every_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._material = read_material(files)
        self._seen = (self._material.ca, self._material.cert, self._material.key)
        self._refused: tuple[bytes, bytes, bytes] | None = None
        self._next_check = monotonic() + check_every_s
        self.generation = 0

    def current(self) -> TlsMaterial:
        """The material to use now, the files read again when ``check_every_s`` has passed."""
        if self._monotonic() >= self._next_check:
            self._check(only_when_due=True)
        return self._material

    def check(self) -> bool:
        """Read the files now; True when they changed and were taken."""
        return self._check(only_when_due=False)

    def _check(self, only_when_due: bool) -> bool:
        with self._lock:
            now = self._monotonic()
            if only_when_due and now < self._next_check:
                return False  # another caller has just read them
            self._next_check = now + self._check_every_s
            try:
                raw = self.files.read()
            except OSError as exc:
                log.debug("TLS file %s not readable now (%s): keeping the current one", exc.filename, exc)
                return False
            if raw == self._seen or raw == self._refused:
                return False
            try:
                material = parse_material(*raw)
            except IncompleteMaterial as exc:
                # Logged once for each content: the next change (the writer finishing) is
                # read again.
                self._refused = raw
                log.warning(
                    "TLS files in %s changed but are not whole yet (%s): still using %s",
                    self.files.cert.parent,
                    exc,
                    self._material.describe(),
                    extra={"fields": {"tls_cert_file": str(self.files.cert)}},
                )
                return False
            previous = self._material
            self._material, self._seen, self._refused = material, raw, None
            self.generation += 1
        log.info(
            "TLS files in %s changed: new connections now use %s (was %s)%s",
            self.files.cert.parent,
            material.describe(),
            previous.describe(),
            "; the trust bundle changed too" if material.ca != previous.ca else "",
            extra={
                "fields": {
                    "tls_cert_file": str(self.files.cert),
                    "tls_serial": f"{material.leaf.serial_number:x}",
                }
            },
        )
        return True


_reloaders: dict[TlsFiles, TlsReloader] = {}
_reloaders_lock = threading.Lock()


def reloader_for(files: TlsFiles) -> TlsReloader:
    """The process's one reader of ``files``: a service builds more than one transport from
    its settings (its server's, its telemetry's), and each change is read and said once."""
    with _reloaders_lock:
        found = _reloaders.get(files)
        if found is None:
            found = _reloaders[files] = TlsReloader(files)
        return found
