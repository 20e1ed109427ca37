"""Is a recorded process still the one we recorded, and still alive?

A pid file outlives its process, and pids are reused; a zombie answers ``kill(pid, 0)``.
So liveness here means: the pid exists, is not a zombie, and its command line (or
environment) still carries a marker only the recorded process has — the worker's state
directory, a runner's spec path, a job's spec path. A false "alive" would leave an attempt
running forever in the agent's eyes; a false "dead" costs one INFRA_ERROR report.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

_PROC = Path("/proc")


def _state(pid: int) -> str | None:
    """The one-letter state of ``pid`` from /proc, or None when there is no such process."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        return "?"
    # The command name sits in parentheses and may itself contain ") ".
    return stat.rsplit(")", 1)[1].split()[0]


def _carries(pid: int, source: str, markers: tuple[str, ...]) -> bool:
    try:
        raw = (_PROC / str(pid) / source).read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except PermissionError:
        return True  # not ours to read: the pid and state checks are all we have
    parts = raw.split(b"\0")
    return all(any(marker.encode() in part for part in parts) for marker in markers)


def is_alive(pid: int | None, *, cmdline: tuple[str, ...] = (), environ: tuple[str, ...] = ()) -> bool:
    """Whether ``pid`` runs, is not a zombie and carries every marker asked for."""
    if pid is None or pid <= 0:
        return False
    if not _PROC.is_dir():  # not Linux: the best we can do is ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state = _state(pid)
    if state is None or state in ("Z", "X", "x"):
        return False
    if cmdline and not _carries(pid, "cmdline", cmdline):
        return False
    return not (environ and not _carries(pid, "environ", environ))


def signal_quietly(pid: int, signum: signal.Signals) -> bool:
    """Send ``signum``; False when the process is already gone."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True
