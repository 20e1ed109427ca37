"""Checkpoints in a folder every scheduler process of the deployment sees.

``staging/<upload id>`` while an upload is under way, ``<checkpoint id>.ckpt`` once
committed. A file is moved into place before its row is written and removed after its row
is deleted, so a crash leaves at worst a file no row names, never a row whose bytes are
gone. Each part is written under an exclusive ``flock`` on its staging file, so two
scheduler processes answering retries of one upload cannot interleave.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from pathlib import Path

from gpufleet.scheduler.checkpoint_store import (
    STALE_UPLOAD_S,
    check_part,
    gap,
    no_upload,
    not_kept,
    wrong_digest,
    wrong_size,
)


class FolderCheckpointStore:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        # Made on the first upload: a scheduler that never sees one writes nothing.
        self.staging_dir = root / "staging"

    def path(self, checkpoint_id: str) -> Path:
        return self.root / f"{checkpoint_id}.ckpt"

    def append(self, upload_id: str, offset: int, data: bytes) -> int:
        check_part(offset, data, self.max_bytes)
        self.staging_dir.mkdir(parents=True, exist_ok=True)
        path = self.staging_dir / upload_id
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            received = os.fstat(fd).st_size
            if offset > received:
                raise gap(offset, received)
            if offset + len(data) > received:
                os.pwrite(fd, data[received - offset :], received)
                os.fsync(fd)
                received = offset + len(data)
            return received
        finally:
            os.close(fd)

    def commit(self, upload_id: str, checkpoint_id: str, size: int, sha256: str) -> None:
        path = self.staging_dir / upload_id
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise no_upload(upload_id) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            digest = hashlib.sha256()
            got = 0
            while chunk := os.read(fd, 1 << 20):
                digest.update(chunk)
                got += len(chunk)
        finally:
            os.close(fd)
        if got != size:
            raise wrong_size(got, size)
        if digest.hexdigest() != sha256:
            path.unlink(missing_ok=True)  # corrupt: the worker sends it again, whole
            raise wrong_digest()
        try:
            os.replace(path, self.path(checkpoint_id))
        except FileNotFoundError:
            # Another process committed (or dropped) this upload while we read it.
            raise no_upload(upload_id) from None
        _fsync_dir(self.root)

    def read(self, checkpoint_id: str, offset: int, max_bytes: int) -> tuple[bytes, bool]:
        try:
            with self.path(checkpoint_id).open("rb") as f:
                f.seek(offset)
                data = f.read(max_bytes)
                return data, f.tell() >= os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            raise not_kept(checkpoint_id) from None

    def remove(self, checkpoint_id: str) -> None:
        self.path(checkpoint_id).unlink(missing_ok=True)

    def drop_stale_uploads(self, now_s: float | None = None) -> int:
        now_s = time.time() if now_s is None else now_s
        dropped = 0
        if not self.staging_dir.is_dir():
            return 0
        for entry in self.staging_dir.iterdir():
            try:
                if now_s - entry.lstat().st_mtime > STALE_UPLOAD_S:
                    entry.unlink()
                    dropped += 1
            except FileNotFoundError:
                continue
        return dropped


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
