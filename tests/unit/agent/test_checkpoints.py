"""The machine's side of checkpoints: packing a folder a tenant's job wrote (links never
followed, half-written files never taken, bounded), unpacking only plain files and
folders, packing only when the folder changed, and the worker's courier sending the
newest packed checkpoint a bounded amount a tick, surviving a lost answer."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from gpufleet.agent import checkpoints
from gpufleet.agent.checkpoints import CheckpointError, Snapshots, pack, signature, unpack
from gpufleet.agent.courier import CheckpointCourier
from gpufleet.agent.reporter import ReportRefused
from gpufleet.agent.specs import JobSpec
from gpufleet.agent.statedir import AttemptFiles
from gpufleet.common.errors import Unavailable


def job_folder(root: Path) -> Path:
    folder = root / "checkpoint"
    (folder / "sub").mkdir(parents=True)
    (folder / "progress.json").write_text('{"done": 4}')
    (folder / "sub" / "weights.bin").write_bytes(b"\x01" * 5000)
    (folder / ".progress.json").write_text("half written")
    (folder / "passwd").symlink_to("/etc/passwd")
    (folder / "escape").symlink_to("/etc")
    return folder


def names(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return {m.name for m in tar}


def test_pack_takes_whole_files_and_folders_and_never_follows_a_link(tmp_path: Path) -> None:
    packed = pack(job_folder(tmp_path), tmp_path / "out.tar", 1 << 20)
    assert names(packed.path) == {"progress.json", "sub", "sub/weights.bin"}
    assert packed.size == packed.path.stat().st_size
    assert packed.sha256 == hashlib.sha256(packed.path.read_bytes()).hexdigest()
    restored = tmp_path / "restored"
    restored.mkdir()
    assert unpack(packed.path, restored, 1 << 20) == 2
    assert (restored / "progress.json").read_text() == '{"done": 4}'
    assert (restored / "sub" / "weights.bin").read_bytes() == b"\x01" * 5000


def test_a_checkpoint_over_the_bound_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="larger than"):
        pack(job_folder(tmp_path), tmp_path / "out.tar", 4096)
    assert list(tmp_path.glob("*out.tar*")) == []


def archive_with(tmp_path: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    path = tmp_path / "evil.tar"
    with tarfile.open(path, "w") as tar:
        tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return path


@pytest.mark.parametrize(
    "member",
    [
        tarfile.TarInfo("../outside"),
        tarfile.TarInfo("/etc/cron.d/evil"),
        (lambda t: (setattr(t, "type", tarfile.SYMTYPE), setattr(t, "linkname", "/etc/passwd"), t)[-1])(
            tarfile.TarInfo("link")
        ),
        (lambda t: (setattr(t, "type", tarfile.LNKTYPE), setattr(t, "linkname", "/etc/passwd"), t)[-1])(
            tarfile.TarInfo("hard")
        ),
        (lambda t: (setattr(t, "type", tarfile.CHRTYPE), t)[-1])(tarfile.TarInfo("dev")),
    ],
    ids=["dotdot", "absolute", "symlink", "hardlink", "device"],
)
def test_unpack_refuses_anything_but_plain_files_and_folders(tmp_path: Path, member: tarfile.TarInfo) -> None:
    target = tmp_path / "target"
    target.mkdir()
    with pytest.raises(CheckpointError):
        unpack(archive_with(tmp_path, member), target, 1 << 20)
    assert not (tmp_path / "outside").exists()


def test_snapshots_pack_only_when_the_folder_changed_and_at_their_cadence(tmp_path: Path) -> None:
    files = AttemptFiles(tmp_path / "attempt")
    files.folder.mkdir()
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    snaps = Snapshots(files, folder, every_s=60, max_bytes=1 << 20)
    assert snaps.maybe(0) is None  # empty: nothing to keep
    (folder / "progress.json").write_text("1")
    assert snaps.maybe(30) is None  # not yet: once a minute
    first = snaps.maybe(61)
    assert first is not None
    assert snaps.maybe(200) is None  # unchanged
    (folder / "progress.json").write_text("22")
    second = snaps.maybe(300)
    assert second is not None
    out = checkpoints.newest_outgoing(files)
    assert out is not None and out.archive == second.path
    assert not first.path.exists(), "only the newest is worth sending"
    assert signature(folder) != ()
    # What an attempt started from is not sent again until the job changes it.
    again = Snapshots(AttemptFiles(tmp_path / "next"), folder, every_s=60, max_bytes=1 << 20)
    assert again.maybe(0) is None


class FakeReports:
    def __init__(self) -> None:
        self.received = bytearray()
        self.commits: list[tuple[int, str]] = []
        self.fail_after: int | None = None
        self.refuse = False
        self.calls = 0

    def put_checkpoint_part(self, attempt_id: str, upload_id: str, offset: int, data: bytes) -> int:
        self.calls += 1
        if self.refuse:
            raise ReportRefused("attempt ended")
        if self.fail_after is not None and self.calls > self.fail_after:
            raise Unavailable("scheduler down")
        self.received[offset : offset + len(data)] = data
        return offset + len(data)

    def commit_checkpoint(self, attempt_id: str, upload_id: str, size: int, sha256: str) -> int:
        assert hashlib.sha256(bytes(self.received)).hexdigest() == sha256
        self.commits.append((size, sha256))
        return len(self.commits)

    def read_checkpoint(self, attempt_id: str, checkpoint_id: str, offset: int) -> tuple[bytes, bool]:
        data = bytes(self.received[offset : offset + 1000])
        return data, offset + len(data) >= len(self.received)


def packed_attempt(tmp_path: Path, size: int) -> AttemptFiles:
    files = AttemptFiles(tmp_path / "attempt")
    files.folder.mkdir()
    folder = tmp_path / "ck"
    folder.mkdir()
    snaps = Snapshots(files, folder, every_s=1, max_bytes=8 << 20)
    (folder / "weights.bin").write_bytes(os.urandom(size))
    assert snaps.maybe(10) is not None
    return files


def test_the_courier_sends_a_bounded_amount_a_tick_and_resumes_after_an_outage(tmp_path: Path) -> None:
    files = packed_attempt(tmp_path, 3 << 20)
    reports = FakeReports()
    courier = CheckpointCourier(reports, send_per_tick_bytes=1 << 20)  # type: ignore[arg-type]
    courier.send([files])
    assert reports.commits == [] and len(reports.received) == 1 << 20
    reports.fail_after = 1  # the next part is not answered
    courier.send([files])
    reports.fail_after = None
    for _ in range(5):
        courier.send([files])
    ((size, _sha),) = reports.commits
    assert size == len(reports.received)
    assert checkpoints.newest_outgoing(files) is None, "sent and dropped"


def test_a_checkpoint_refused_for_good_is_dropped(tmp_path: Path) -> None:
    files = packed_attempt(tmp_path, 1000)
    reports = FakeReports()
    reports.refuse = True
    CheckpointCourier(reports, send_per_tick_bytes=1 << 20).send([files])  # type: ignore[arg-type]
    assert checkpoints.newest_outgoing(files) is None


def test_fetch_checks_size_and_digest_and_otherwise_starts_from_the_beginning(tmp_path: Path) -> None:
    reports = FakeReports()
    reports.received[:] = b"progress" * 500
    sha = hashlib.sha256(bytes(reports.received)).hexdigest()
    spec = JobSpec("a1", "j1", 0, checkpoint_id="c1", checkpoint_sha256=sha, checkpoint_size_bytes=4000)
    courier = CheckpointCourier(reports, send_per_tick_bytes=1)  # type: ignore[arg-type]
    dest = tmp_path / "restore"
    assert courier.fetch(spec, dest) and dest.read_bytes() == bytes(reports.received)
    bad = JobSpec("a1", "j1", 0, checkpoint_id="c1", checkpoint_sha256="0" * 64, checkpoint_size_bytes=4000)
    assert not courier.fetch(bad, dest) and not dest.exists()
