"""Process handling for the local driver: a local machine is a process session.

Each machine's agent is started in a new session (``start_new_session=True``), so the
agent, its worker and its runners share one process group and session whose id is the
agent's pid; ending the machine means ending that whole group, and "is it running" means
"does that group still have a live (non-zombie) process". Starting a new session also
means the provisioner's own restart never takes a machine down with it.

These waits are on real processes on this host, so they are bounded waits in real time
(monotonic), not on the injected clock: a scaled or manual clock must not make a kill
grace period shorter or longer than the kernel needs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

_PROC = Path("/proc")
_POLL_S = 0.05


def group_members(pgid: int) -> list[int]:
    """Pids of the live processes in process group or session ``pgid`` (zombies excluded)."""
    if not _PROC.is_dir():  # no /proc (macOS): ask the kernel about the group as a whole
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    members: list[int] = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # "pid (comm) state ppid pgrp session ..."; comm may hold spaces and parentheses.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) < 4 or fields[0] in ("Z", "X"):
            continue
        if int(fields[2]) == pgid or int(fields[3]) == pgid:
            members.append(int(entry.name))
    return members


def wait_until(done: Callable[[], bool], timeout_s: float) -> bool:
    """Poll ``done`` until it holds or ``timeout_s`` of real time passed; returns its last value."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()  # never set: a bounded real-time pause between polls
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        pause.wait(_POLL_S)


def _signal_all(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    # A member that moved to its own process group but stayed in the session.
    for pid in group_members(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_group(pgid: int, grace_s: float, reap: Callable[[], None]) -> bool:
    """SIGTERM every process of the machine, SIGKILL what is left after ``grace_s``.

    ``reap`` collects our own exited children (so they do not linger as zombies). Returns
    True when nothing of the group is left alive.
    """

    def gone() -> bool:
        reap()
        return not group_members(pgid)

    if gone():
        return True
    _signal_all(pgid, signal.SIGTERM)
    if wait_until(gone, grace_s):
        return True
    _signal_all(pgid, signal.SIGKILL)
    return wait_until(gone, 5.0)


def spawn_session(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path
) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached in a new session, its output appended to ``log_path``."""
    with log_path.open("ab") as log:
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
