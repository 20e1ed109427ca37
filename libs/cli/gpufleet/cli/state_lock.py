"""One `gpufleet up` per state folder: a lock file (``<state dir>/up.lock``) held with
``flock`` for as long as the stack runs, the holder's pid written in it.

A second `up` on the folder would share the first one's SQLite file, clock and local
machines, and used to print ``ready.`` because the first stack answered its health
checks; now it is refused before it starts anything. ``flock`` is released by the kernel
when its holder dies however it dies, so a lock left by a killed `up` is stale by
construction: the next `up` takes it over (and says so). The file itself is never
removed — removing it while another process waits on it would let two hold "the" lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = "up.lock"


class StateDirInUse(RuntimeError):
    """Another `gpufleet up` runs on this state folder."""


def lock_path(state_dir: Path) -> Path:
    return state_dir / LOCK_FILE


def holder_pid(state_dir: Path) -> int | None:
    """The pid written in the lock file (whether or not it still holds it)."""
    try:
        return int(json.loads(lock_path(state_dir).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def held(state_dir: Path) -> bool:
    """Whether some live process holds the folder's lock now."""
    path = lock_path(state_dir)
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the lock this look may have taken
    return False


@dataclass
class StateLock:
    path: Path
    fd: int
    # The pid of a holder that died without letting go (its lock is taken over).
    stale_pid: int | None

    @classmethod
    def take(cls, state_dir: Path) -> StateLock:
        state_dir.mkdir(parents=True, exist_ok=True)
        path = lock_path(state_dir)
        before = holder_pid(state_dir)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the services
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            who = f"pid {before}" if before else "another process"
            raise StateDirInUse(
                f"{state_dir} is in use by another `gpufleet up` ({who}): stop it with "
                f"`gpufleet down --state-dir {state_dir}`, or use another --state-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({"pid": os.getpid()}).encode())
        return cls(path, fd, before if before and before != os.getpid() else None)

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)
        os.close(self.fd)
