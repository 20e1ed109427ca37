"""Following a part's TLS files: a change is taken once whole, never half-way.

The reloader reads the files again only when asked after its interval; the tests step a
fake monotonic clock instead of waiting."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.material import IncompleteMaterial, parse_material
from gpufleet.common.trust.pki import Authority, TlsFiles
from gpufleet.common.trust.reload import TlsReloader
from gpufleet.common.trust.transport import Transport, TransportNotConfigured
from tests.support.kubelet_volume import KubeletVolume

SCHEDULER = Identity(Role.SCHEDULER, "local")


class Ticks:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority.ensure(tmp_path / "ca", "local")


def issued(authority: Authority, folder: Path, who: Identity = SCHEDULER) -> TlsFiles:
    folder.mkdir(parents=True, exist_ok=True)
    return authority.issue(who, TlsFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key"))


def serial_of(reloader: TlsReloader) -> int:
    return reloader.current().leaf.serial_number


def test_a_kubelet_swap_is_taken_once_the_interval_has_passed(authority: Authority, tmp_path: Path) -> None:
    volume = KubeletVolume(tmp_path / "mount")
    volume.publish_files(issued(authority, tmp_path / "first"))
    ticks = Ticks()
    reloader = TlsReloader(volume.files, check_every_s=10, monotonic=ticks)
    first = reloader.current()

    volume.publish_files(issued(authority, tmp_path / "second"))
    ticks.now = 9.9
    assert reloader.current() is first  # not read again yet
    ticks.now = 10.0
    renewed = reloader.current()
    assert renewed.leaf.serial_number != first.leaf.serial_number
    assert renewed.cert == (tmp_path / "second" / "tls.crt").read_bytes()
    assert reloader.generation == 1
    ticks.now = 20.0
    assert reloader.current() is renewed  # unchanged files: the same material, not a new one
    assert reloader.generation == 1


def test_a_half_written_certificate_is_ignored_until_it_is_whole(
    authority: Authority, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = issued(authority, tmp_path / "part")
    reloader = TlsReloader(files, check_every_s=0)
    first = serial_of(reloader)
    new = issued(authority, tmp_path / "next")
    whole = new.cert.read_bytes()

    # A writer that replaces the key, then writes the certificate in two goes.
    shutil.copy(new.key, files.key)
    assert serial_of(reloader) == first  # the key is not the old certificate's
    files.cert.write_bytes(whole[: len(whole) // 2])
    assert serial_of(reloader) == first  # cut inside its PEM block
    assert "not whole yet" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert serial_of(reloader) == first
    assert caplog.records == []  # the same refused content is not logged again
    files.cert.write_bytes(whole)
    assert serial_of(reloader) != first
    assert reloader.current().cert == whole


def test_a_bundle_cut_after_its_first_certificate_is_not_taken(authority: Authority, tmp_path: Path) -> None:
    """Two roots during a CA rotation: a bundle read with only the first would drop the
    second silently, though it parses."""
    files = issued(authority, tmp_path / "part")
    reloader = TlsReloader(files, check_every_s=0)
    other = Authority.ensure(tmp_path / "other-ca", "local")
    both = authority.ca_path.read_bytes() + other.ca_path.read_bytes()
    files.ca.write_bytes(both[: len(both) - 40])
    assert reloader.current().ca == authority.ca_path.read_bytes()
    files.ca.write_bytes(both)
    assert reloader.current().ca == both


def test_a_file_gone_for_a_moment_keeps_what_was_read(authority: Authority, tmp_path: Path) -> None:
    files = issued(authority, tmp_path / "part")
    reloader = TlsReloader(files, check_every_s=0)
    first = reloader.current()
    files.cert.unlink()
    assert reloader.current() is first
    assert not reloader.check()


@pytest.mark.parametrize(
    ("which", "content", "says"),
    [
        ("cert", b"", "no complete PEM block"),
        ("cert", b"-----BEGIN CERTIFICATE-----\nMIIB\n", "no complete PEM block"),
        ("key", b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", "key"),
        ("ca", b"not a certificate", "trust bundle"),
    ],
)
def test_material_that_is_not_whole_is_refused_by_name(
    authority: Authority, tmp_path: Path, which: str, content: bytes, says: str
) -> None:
    files = issued(authority, tmp_path / "part")
    raw = dict(zip(("ca", "cert", "key"), files.read(), strict=True))
    raw[which] = content
    with pytest.raises(IncompleteMaterial, match=says):
        parse_material(raw["ca"], raw["cert"], raw["key"])


def test_a_process_does_not_start_on_files_that_are_not_whole(authority: Authority, tmp_path: Path) -> None:
    files = issued(authority, tmp_path / "part")
    other = issued(authority, tmp_path / "other")
    shutil.copy(other.key, files.key)
    with pytest.raises(TransportNotConfigured, match="key is not the certificate's"):
        Transport.from_paths("local", str(files.ca), str(files.cert), str(files.key), False, "scheduler")


def test_the_transport_hands_out_the_renewed_credentials(authority: Authority, tmp_path: Path) -> None:
    """What a library's own channel (the OTLP exporter) is given is the material in force."""
    volume = KubeletVolume(tmp_path / "mount")
    volume.publish_files(issued(authority, tmp_path / "first"))
    transport = Transport.from_paths(
        "local", str(volume.files.ca), str(volume.files.cert), str(volume.files.key), False, "scheduler"
    )
    first = transport.tls.current()
    volume.publish_files(issued(authority, tmp_path / "second"))
    assert transport.tls.check()
    assert transport.tls.current() is not first
    assert transport.tls.current().cert == (tmp_path / "second" / "tls.crt").read_bytes()
