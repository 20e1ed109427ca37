"""The kernel's record of jobs' lifetimes, to prove no two attempts of a job ran at once.

Each job is its own process group (the runner starts it with ``process_group=0``), its
leader's pid recorded in its attempt's ``runner.json``. :class:`JobWatch` polls /proc for
every group it is given: a job's start is the earliest start time the kernel recorded for
a process of the group (exact, in seconds since boot), and its end the first look that
found none of them left (late by one poll at most, so never early).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def boot_seconds() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def group_members(pgid: int) -> list[tuple[int, float]]:
    """The live (not zombie) processes of a process group, with their start times in
    seconds since boot as the kernel recorded them."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            # state ppid pgrp ... starttime is the 22nd field of stat, the 20th after comm.
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                members.append((int(entry.name), int(fields[19]) / _TICKS))
    return members


@dataclass
class Lifetime:
    """A job's processes as /proc shows them: the first start, and the first look that
    found none left (an upper bound on its end, a poll late at most)."""

    started: float
    gone: float | None = None


class JobWatch:
    """Polls /proc for the process groups of the jobs it is given (each job is its own
    group, its leader's pid recorded in runner.json)."""

    def __init__(self) -> None:
        self.lives: dict[str, Lifetime] = {}
        self._groups: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def track(self, attempt_id: str, attempt_folder: Path) -> None:
        state = json.loads((attempt_folder / "runner.json").read_text())
        pgid = int(state["job_pid"])
        members = group_members(pgid)
        assert members, f"the job of {attempt_id} is not running"
        with self._lock:
            self._groups[attempt_id] = pgid
            self.lives[attempt_id] = Lifetime(started=min(start for _, start in members))

    def gone_at(self, attempt_id: str) -> float | None:
        with self._lock:
            return self.lives[attempt_id].gone

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            with self._lock:
                groups = dict(self._groups)
            for attempt_id, pgid in groups.items():
                if self.lives[attempt_id].gone is None and not group_members(pgid):
                    with self._lock:
                        self.lives[attempt_id].gone = boot_seconds()
                        del self._groups[attempt_id]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def monotonic_to_boot(at: float) -> float:
    """A ``time.monotonic()`` reading on the kernel's boot clock (the same but for suspend)."""
    return at + (boot_seconds() - time.monotonic())
