"""A job's checkpoint folder on the machine: packed while the job runs, sent to the
control plane by the worker, and restored into the next attempt's folder.

The job (a kind that resumes from checkpoints) finds its folder in
``GPUFLEET_CHECKPOINT_DIR`` and writes its progress there; a file is taken once it is
whole, so a job writes a file under a name starting with ``.`` and renames it into place
(names starting with ``.`` are never taken). Every ``checkpoint_every_s`` the runner packs
the folder when it changed into the attempt's outbox — an uncompressed tar of its regular
files and folders, bounded in bytes and files — and the worker sends the newest packed
one (``WorkerService.PutCheckpointPart`` / ``CommitCheckpoint``), a few parts a tick, so a
large checkpoint never holds up a heartbeat. The next attempt's worker reads the newest
kept checkpoint back (``ReadCheckpoint``), checks its size and SHA-256, and the runner
unpacks it into the new job's folder before the job starts.

The folder is written by a tenant's job and read by the runner as root: packing walks it
with :func:`os.fwalk` and opens every file relative to its folder's descriptor with
``O_NOFOLLOW``, so a link planted in it (or swapped in while it is read) is never
followed; links, devices and sockets are left out. Unpacking accepts only regular files
and folders with plain relative names, into a folder the job has not started in yet.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import stat
import tarfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from gpufleet.agent.statedir import AttemptFiles, atomic_write_json, read_json

log = logging.getLogger(__name__)

PART_BYTES = 1 << 20
MAX_FILES = 10_000


class CheckpointError(Exception):
    """A checkpoint that cannot be packed or unpacked; the message says why."""


@dataclass(frozen=True)
class Packed:
    path: Path
    size: int
    sha256: str


def _entries(folder: Path) -> Iterator[tuple[str, int, os.stat_result]]:
    """(relative path, its folder's fd, lstat) of each regular file, and of each folder,
    never following a link. A name starting with '.' is a file still being written."""
    for dirpath, dirnames, filenames, dirfd in os.fwalk(folder, follow_symlinks=False):
        rel_dir = os.path.relpath(dirpath, folder)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield os.path.normpath(os.path.join(rel_dir, name)), dirfd, st
        for name in dirnames:
            try:
                st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):  # a link to a folder is listed here too: left out
                yield os.path.normpath(os.path.join(rel_dir, name)) + "/", dirfd, st


def signature(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """What the folder holds, cheaply: changes when a file appears, goes or is rewritten."""
    if not folder.is_dir():
        return ()
    return tuple(sorted((rel, st.st_size, st.st_mtime_ns) for rel, _fd, st in _entries(folder)))


def pack(folder: Path, dest: Path, max_bytes: int) -> Packed:
    """Pack ``folder`` into ``dest`` (written whole or not at all)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    digest = hashlib.sha256()
    count = 0
    try:
        with tmp.open("wb") as raw:
            writer = _HashingWriter(raw, digest)
            with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for rel, dirfd, _st in _entries(folder):
                    count += 1
                    if count > MAX_FILES:
                        raise CheckpointError(f"more than {MAX_FILES} files")
                    if rel.endswith("/"):
                        info = tarfile.TarInfo(rel.rstrip("/"))
                        info.type = tarfile.DIRTYPE
                        info.mode = 0o755
                        tar.addfile(info)
                        continue
                    name = os.path.basename(rel)
                    try:
                        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dirfd)
                    except (FileNotFoundError, OSError):
                        continue  # gone, or swapped for a link meanwhile: not taken
                    with os.fdopen(fd, "rb") as f:
                        now = os.fstat(f.fileno())
                        if not stat.S_ISREG(now.st_mode):
                            continue
                        info = tarfile.TarInfo(rel)
                        info.size = now.st_size
                        info.mode = 0o644
                        info.mtime = int(now.st_mtime)
                        if writer.written + now.st_size > max_bytes:
                            raise CheckpointError(f"larger than {max_bytes} bytes")
                        tar.addfile(info, _Exactly(f, now.st_size))
            raw.flush()
            os.fsync(raw.fileno())
        if writer.written > max_bytes:
            raise CheckpointError(f"larger than {max_bytes} bytes")
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Packed(dest, writer.written, digest.hexdigest())


def unpack(archive: Path, folder: Path, max_bytes: int) -> int:
    """Unpack a checkpoint into the (new, empty) ``folder``; the files written."""
    written = 0
    files = 0
    with tarfile.open(archive, mode="r:") as tar:
        for member in tar:
            rel = PurePosixPath(member.name)
            if rel.is_absolute() or ".." in rel.parts or not rel.parts or member.name.startswith("/"):
                raise CheckpointError(f"unsafe name {member.name!r}")
            target = folder.joinpath(*rel.parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            if not member.isreg():
                raise CheckpointError(f"{member.name!r} is not a regular file")
            files += 1
            written += member.size
            if written > max_bytes or files > MAX_FILES:
                raise CheckpointError("larger than a checkpoint may be")
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                while chunk := source.read(PART_BYTES):
                    out.write(chunk)
    return files


class Snapshots:
    """The runner's side: pack the job's checkpoint folder into the attempt's outbox when
    it changed, at most every ``every_s`` of the clock."""

    def __init__(self, files: AttemptFiles, folder: Path, every_s: float, max_bytes: int) -> None:
        self.files = files
        self.folder = folder
        self.every_s = every_s
        self.max_bytes = max_bytes
        self._last_sig: tuple[tuple[str, int, int], ...] = signature(folder)  # the restored one
        self._last_at: float | None = None
        self._seq = 0

    def maybe(self, now_s: float) -> Packed | None:
        if self._last_at is not None and now_s - self._last_at < self.every_s:
            return None
        self._last_at = now_s
        sig = signature(self.folder)
        if not sig or sig == self._last_sig:
            return None
        outbox = outbox_of(self.files)
        outbox.mkdir(exist_ok=True)
        self._seq += 1
        try:
            packed = pack(self.folder, outbox / f"{self._seq:06d}.tar", self.max_bytes)
        except (CheckpointError, OSError) as err:
            log.warning("attempt %s: checkpoint not taken: %s", self.files.attempt_id, err)
            self._last_sig = sig  # not again until the folder changes
            return None
        atomic_write_json(outbox / f"{self._seq:06d}.json", {"size": packed.size, "sha256": packed.sha256})
        self._last_sig = sig
        log.info("attempt %s: checkpoint %d packed (%d bytes)", self.files.attempt_id, self._seq, packed.size)
        return packed


def outbox_of(files: AttemptFiles) -> Path:
    return files.folder / "checkpoints"


def restore_file(files: AttemptFiles) -> Path:
    return files.folder / "checkpoint.restore"


@dataclass
class Outgoing:
    """The newest packed checkpoint of an attempt, and how much of it was sent."""

    archive: Path
    size: int
    sha256: str
    upload_id: str
    sent: int

    @property
    def progress(self) -> Path:
        return self.archive.with_suffix(".sent")


def newest_outgoing(files: AttemptFiles) -> Outgoing | None:
    """The newest whole packed checkpoint; older ones are dropped (only the newest is
    worth sending)."""
    outbox = outbox_of(files)
    if not outbox.is_dir():
        return None
    metas = sorted(outbox.glob("[0-9]*.json"))
    if not metas:
        return None
    for older in metas[:-1]:
        for suffix in (".json", ".tar", ".sent"):
            older.with_suffix(suffix).unlink(missing_ok=True)
    meta = read_json(metas[-1])
    archive = metas[-1].with_suffix(".tar")
    if not isinstance(meta, dict) or not archive.exists():
        return None
    progress = read_json(archive.with_suffix(".sent"))
    if isinstance(progress, dict):
        upload_id, sent = str(progress["upload_id"]), int(progress["sent"])
    else:
        upload_id, sent = str(uuid.uuid4()), 0
    return Outgoing(archive, int(meta["size"]), str(meta["sha256"]), upload_id, sent)


def record_progress(out: Outgoing) -> None:
    atomic_write_json(out.progress, {"upload_id": out.upload_id, "sent": out.sent})


def drop(out: Outgoing) -> None:
    for suffix in (".json", ".tar", ".sent"):
        out.archive.with_suffix(suffix).unlink(missing_ok=True)


def read_part(out: Outgoing) -> bytes:
    with out.archive.open("rb") as f:
        f.seek(out.sent)
        return f.read(PART_BYTES)


class _HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, raw: io.BufferedWriter, digest: hashlib._Hash) -> None:
        self.raw = raw
        self.digest = digest
        self.written = 0

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.raw.write(data)
        self.digest.update(data)
        self.written += len(data)
        return len(data)


class _Exactly(io.RawIOBase):
    """At most ``size`` bytes of ``f``, padded with zeros if the file shrank meanwhile (its
    header already promised ``size``)."""

    def __init__(self, f: io.BufferedReader, size: int) -> None:
        self.f = f
        self.left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        if self.left <= 0:
            return b""
        want = self.left if n < 0 else min(n, self.left)
        data = self.f.read(want) or b"\0" * want
        self.left -= len(data)
        return data
