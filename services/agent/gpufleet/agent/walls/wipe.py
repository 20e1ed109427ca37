"""Clean before and after: a slot keeps nothing of one job for the next.

Everything here runs as root over folders a job could write, so nothing follows a link
the job planted: folders are opened with ``O_NOFOLLOW`` and emptied through their file
descriptors (``unlinkat``/``rmdir`` relative to an fd), and ownership is only ever changed
with ``lchown`` on what this code itself just made. A job that links its folder's contents
to ``/etc`` gets the link removed, never ``/etc``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Iterable
from pathlib import Path

# The slot's processes are found and killed as the local driver finds a destroyed
# machine's: one implementation (re-exported here for the walls' callers).
from gpufleet.common.host_release import kill_processes_of, processes_of

__all__ = [
    "empty_folder",
    "kill_processes_of",
    "make_private_folder",
    "processes_of",
    "remove_ipc_of",
    "remove_owned_entries",
    "remove_tree",
]

_IPC_ID_COLUMN = {"shm": "shmid", "sem": "semid", "msg": "msqid"}
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def empty_folder(folder: Path) -> None:
    """Remove everything inside ``folder`` (a real folder, never a link's target)."""
    try:
        fd = os.open(folder, _DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        _empty_fd(fd)
    finally:
        os.close(fd)


def remove_tree(folder: Path) -> None:
    """Remove ``folder`` and its contents; a link in its place is removed as a link."""
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        folder.unlink()
        return
    empty_folder(folder)
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(folder)


def _empty_fd(fd: int) -> None:
    for entry in os.scandir(fd):
        _remove_at(fd, entry.name)


def _remove_at(dir_fd: int, name: str) -> None:
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        try:
            os.fchmod(child, 0o700)  # a job may have made it unwritable to keep it
            _empty_fd(child)
        finally:
            os.close(child)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=dir_fd)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)


def make_private_folder(path: Path, uid: int, gid: int, mode: int = 0o700) -> None:
    """Create ``path`` afresh (whatever was there is removed) owned by ``uid``."""
    remove_tree(path)
    path.mkdir(mode=mode)
    os.lchown(path, uid, gid)
    path.chmod(mode)


def remove_owned_entries(folders: Iterable[Path], uid: int) -> int:
    """Remove the top-level entries of shared temporary folders that ``uid`` owns."""
    removed = 0
    for folder in folders:
        try:
            fd = os.open(folder, _DIR_FLAGS)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            for entry in os.scandir(fd):
                with contextlib.suppress(FileNotFoundError):
                    if os.lstat(entry.name, dir_fd=fd).st_uid == uid:
                        _remove_at(fd, entry.name)
                        removed += 1
        finally:
            os.close(fd)
    return removed


def remove_ipc_of(uid: int, sysvipc: Path = Path("/proc/sysvipc")) -> int:
    """Remove the SysV shared memory, semaphores and queues ``uid`` owns (host namespace)."""
    removed = 0
    for table, flag in (("shm", "-m"), ("sem", "-s"), ("msg", "-q")):
        try:
            lines = (sysvipc / table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        header = (sysvipc / table).read_text().splitlines()[0].split()
        id_col, uid_col = header.index(_IPC_ID_COLUMN[table]), header.index("uid")
        for line in lines:
            cols = line.split()
            if len(cols) > uid_col and int(cols[uid_col]) == uid:
                done = subprocess.run(["ipcrm", flag, cols[id_col]], capture_output=True, check=False)
                removed += done.returncode == 0
    return removed
