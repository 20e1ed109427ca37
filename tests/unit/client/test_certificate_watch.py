"""The client's certificate folder followed as its files change: renewed content is taken,
looked at no more often than asked, and only when it is whole; and the channels' books — a
retired channel is closed when its last call ends, at once when none is going on."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from cryptography import x509

from gpufleet.client.certificates import CertificateFolder, CertificateWatch, IncompleteCertificates
from gpufleet.client.channels import Channels
from gpufleet.client.connection import Connection
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority, TlsFiles
from tests.support.kubelet_volume import KubeletVolume


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def files(folder: Path) -> TlsFiles:
    return TlsFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key")


def issue(authority: Authority, folder: Path, role: Role = Role.BACKEND) -> int:
    authority.issue(Identity(role, authority.deployment), files(folder))
    return x509.load_pem_x509_certificate((folder / "tls.crt").read_bytes()).serial_number


@pytest.fixture
def authority(tmp_path: Path) -> Authority:
    return Authority.ensure(tmp_path / "ca", "prod-eu")


def test_renewed_files_are_taken_when_next_looked_at(tmp_path: Path, authority: Authority) -> None:
    folder = tmp_path / "backend"
    first = issue(authority, folder)
    clock = Clock()
    watch = CertificateWatch(folder, check_every_s=1.0, monotonic=clock)
    taken = watch.current()
    assert taken.serial == first

    second = issue(authority, folder)
    clock.now += 0.5
    assert watch.current() is taken  # not looked at again yet
    clock.now += 0.5
    renewed = watch.current()
    assert renewed.serial == second and watch.changes == 1
    assert (renewed.deployment, renewed.role, renewed.server_name) == (
        "prod-eu",
        "backend",
        "scheduler.gpufleet.prod-eu",
    )
    clock.now += 5
    assert watch.current() is renewed  # nothing changed: the same content, not read again


def test_a_touched_file_with_the_same_content_is_no_change(tmp_path: Path, authority: Authority) -> None:
    folder = tmp_path / "backend"
    issue(authority, folder)
    watch = CertificateWatch(folder)
    before = watch.current()
    os.utime(folder / "tls.crt", ns=(1, 1))
    assert not watch.check()
    assert watch.current() is before and watch.changes == 0


def test_a_new_key_beside_the_old_certificate_waits_for_the_certificate(
    tmp_path: Path, authority: Authority, caplog: pytest.LogCaptureFixture
) -> None:
    """`gpufleet certs issue` writes the key, then the certificate: between the two, the
    folder holds a pair that does not belong together."""
    folder, staged = tmp_path / "backend", tmp_path / "staged"
    first = issue(authority, folder)
    watch = CertificateWatch(folder)
    second = issue(authority, staged)
    (folder / "tls.key").write_bytes((staged / "tls.key").read_bytes())
    with caplog.at_level(logging.WARNING, "gpufleet.client"):
        assert not watch.check()
        assert not watch.check()  # the same content: said once
    assert watch.current().serial == first
    assert [r.getMessage() for r in caplog.records if "not the key of tls.crt" in r.getMessage()] != []
    assert len(caplog.records) == 1
    (folder / "tls.crt").write_bytes((staged / "tls.crt").read_bytes())
    assert watch.check() and watch.current().serial == second


@pytest.mark.parametrize(
    ("name", "cut"),
    [
        ("tls.crt", lambda pem: pem[: len(pem) // 2]),
        ("ca.crt", lambda pem: pem + b"-----BEGIN CERTIFICATE-----\nMIIB"),
        ("tls.key", lambda pem: b""),
    ],
)
def test_a_half_written_file_is_not_taken(
    tmp_path: Path, authority: Authority, name: str, cut: object
) -> None:
    folder, staged = tmp_path / "backend", tmp_path / "staged"
    first = issue(authority, folder)
    watch = CertificateWatch(folder)
    second = issue(authority, staged)
    for each in ("ca.crt", "tls.crt", "tls.key"):
        data = (staged / each).read_bytes()
        (folder / each).write_bytes(cut(data) if each == name else data)  # type: ignore[operator]
    assert not watch.check() and watch.current().serial == first
    (folder / name).write_bytes((staged / name).read_bytes())  # the writer finishes
    assert watch.check() and watch.current().serial == second


def test_a_missing_file_keeps_the_current_content(tmp_path: Path, authority: Authority) -> None:
    folder = tmp_path / "backend"
    first = issue(authority, folder)
    watch = CertificateWatch(folder)
    (folder / "tls.key").unlink()
    assert not watch.check() and watch.current().serial == first


def test_a_certificate_of_another_deployment_is_not_taken(tmp_path: Path, authority: Authority) -> None:
    folder = tmp_path / "backend"
    first = issue(authority, folder)
    watch = CertificateWatch(folder)
    issue(Authority.ensure(tmp_path / "other-ca", "staging"), folder)
    assert not watch.check()
    assert watch.current().serial == first and watch.current().deployment == "prod-eu"


def test_the_key_must_be_the_certificates_from_the_start(tmp_path: Path, authority: Authority) -> None:
    folder, staged = tmp_path / "backend", tmp_path / "staged"
    issue(authority, folder)
    issue(authority, staged)
    (folder / "tls.key").write_bytes((staged / "tls.key").read_bytes())
    with pytest.raises(IncompleteCertificates, match=r"not the key of tls\.crt"):
        CertificateFolder.read(folder)


def test_a_kubelet_swap_through_symlinks_is_seen(tmp_path: Path, authority: Authority) -> None:
    volume = KubeletVolume(tmp_path / "mount")
    staged = tmp_path / "staged"
    issue(authority, staged / "1")
    volume.publish_files(files(staged / "1"))
    watch = CertificateWatch(volume.folder)
    second = issue(authority, staged / "2")
    volume.publish_files(files(staged / "2"))
    assert watch.check() and watch.current().serial == second


# ---- the channels' books ----------------------------------------------------------------------


class FakeChannel:
    def __init__(self, credentials: object) -> None:
        self.credentials = credentials
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def unary_unary(self, *args: object, **kwargs: object) -> None:
        return None

    unary_stream = stream_unary = stream_stream = unary_unary


def fake_channels(folder: Path) -> tuple[Channels[FakeChannel], list[FakeChannel]]:
    conn = Connection("127.0.0.1:1", CertificateWatch(folder, check_every_s=0), [])
    opened: list[FakeChannel] = []

    def open_channel(credentials: object) -> FakeChannel:
        opened.append(FakeChannel(credentials))
        return opened[-1]

    return Channels(conn, open_channel), opened


def test_a_retired_channel_closes_after_its_last_call(tmp_path: Path, authority: Authority) -> None:
    folder = tmp_path / "backend"
    issue(authority, folder)
    channels, opened = fake_channels(folder)
    streaming, stale = channels.acquire()  # a watch's stream, say
    quick, _ = channels.acquire()
    assert channels.release(quick) is None and stale == []

    issue(authority, folder)
    after, stale = channels.acquire()
    assert after is not streaming and stale == [] and len(opened) == 2
    assert channels.open_channels == 2
    assert channels.release(after) is None  # the channel in force stays open
    assert channels.release(streaming) is opened[0]  # its last call ended: close it
    assert channels.open_channels == 1 and channels.opened == 2


def test_a_retired_channel_with_no_call_is_closed_at_once(tmp_path: Path, authority: Authority) -> None:
    folder = tmp_path / "backend"
    issue(authority, folder)
    channels, opened = fake_channels(folder)
    issue(authority, folder)
    generation, stale = channels.acquire()
    assert stale == [opened[0]] and generation.channel is opened[1]
    assert channels.release(generation) is None
    assert channels.close_all() == [opened[1]]
    # Closed: a change of the files opens nothing more.
    issue(authority, folder)
    generation, stale = channels.acquire()
    assert generation.channel is opened[1] and stale == [] and len(opened) == 2
