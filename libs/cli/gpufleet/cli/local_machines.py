"""Ending a stack's local machines from outside the provisioner: `gpufleet down`, Ctrl-C on
`up`, and the demo's clean-up.

A local machine is a process session (its agent's pid is the session's id, kept in
``machines/<id>/disk/agent.pid``). Ending one is what the local driver does to stop it:
first the stopping record on its disk, so a job that dies of the signals is recorded as
the platform's kill (never charged, never counted against its retry budget), then SIGTERM
to the session, SIGKILL to what is left after a grace. Then the slot users, walls folder
and cgroups the stack's machines took on the host are given back.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path

from gpufleet.common import host_release

# The agent's gpufleet.agent.platform_kills.MACHINE_RECORD, which the provisioner's local
# driver writes too (the CLI may import neither; a unit test keeps the three equal).
STOPPING_MARKER = "machine.stopping"
PID_FILE = "agent.pid"
_PROC = Path("/proc")


def machines_root(state_dir: Path) -> Path:
    return state_dir / "machines"


def running(state_dir: Path) -> dict[Path, int]:
    """Each local machine's disk folder -> its session id, for those with a live process."""
    found = {}
    for pid_file in machines_root(state_dir).glob(f"*/disk/{PID_FILE}"):
        try:
            session = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if members(session):
            found[pid_file.parent] = session
    return found


def members(session: int) -> list[int]:
    """Live (not zombie) processes of the session or process group ``session``."""
    if not _PROC.is_dir():
        try:
            os.killpg(session, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [session]
    out = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()  # "pid (comm) state ppid pgrp session ..."
        if len(fields) >= 4 and fields[0] not in ("Z", "X") and session in (int(fields[2]), int(fields[3])):
            out.append(int(entry.name))
    return out


def _signal(session: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(session, sig)
    for pid in members(session):  # one that moved to a group of its own, in the session
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(sessions: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while any(members(s) for s in sessions):
        if time.monotonic() >= deadline:
            return False
        pause.wait(0.05)  # real time: the kernel's, not the system's clock
    return True


def stop_all(
    state_dir: Path,
    grace_s: float = 10.0,
    why: str = "its stack was stopped (gpufleet down, or Ctrl-C on up)",
) -> int:
    """End every local machine of the stack in ``state_dir`` and give back what they took
    on the host; how many were running."""
    machines = running(state_dir)
    for disk in machines:
        with contextlib.suppress(OSError):
            (disk / STOPPING_MARKER).write_text(f"{why}\n")
    sessions = list(machines.values())
    for session in sessions:
        _signal(session, signal.SIGTERM)
    if not _wait_gone(sessions, grace_s):
        for session in sessions:
            _signal(session, signal.SIGKILL)
        _wait_gone(sessions, 5.0)
    for problem in host_release.release_stack(machines_root(state_dir)):
        print(f"gpufleet: not given back: {problem}", file=sys.stderr)
    return len(machines)
