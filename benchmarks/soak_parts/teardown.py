"""Ending every process the soak's machines ran, and proving that nothing outlived the soak.

A local machine is a process session whose id the local driver keeps in its
``instance.json`` (``pgid``): the systemd stand-in (agent_unit.py), the agent it restarts,
the worker and the runners, all running in the machine's folder. A machine the nets
stopped and the scale step started again is a new session, and the record then holds only
the new one, so :class:`MachineGroups` keeps every group any record ever held.

:func:`end_machines` ends every process of every machine (:func:`machine_processes`): any
whose command line, environment or working directory is in a machine's folder, the members
of every recorded group and session, the processes of the disks' pid files (``agent.pid``,
``worker.pid``, each attempt's ``runner.json``), and every descendant of those (a job
process in a session of its own, the stand-ins' children) — SIGCONT first (a paused agent
cannot act on SIGTERM), SIGTERM, a few seconds, SIGKILL. :func:`leftovers` is the check
after the whole teardown: any live process whose command line, environment or working
directory points into the soak's state folder, or that is in one of the machines' groups,
is killed and named.

Group ids and pids are reused (this host's pid_max is 32768): a group counts only while one
of its members is still the machines' (points into their folders), a pid file's pid only
when its process points into the machines' folder.

Everything here reads ``/proc`` (Linux): one pass over it is a few milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

_PROC = Path("/proc")
PID_FILES = ("agent.pid", "worker.pid")


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int


def process_table() -> dict[int, Proc]:
    """Every live (not zombie) process on the host."""
    table = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            # "pid (comm) state ppid pgrp session ..."; comm may hold spaces and parentheses.
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            if fields[0] not in ("Z", "X"):
                pid = int(entry.name)
                table[pid] = Proc(pid, int(fields[1]), int(fields[2]), int(fields[3]))
    return table


def machine_groups(machines_root: Path) -> dict[int, str]:
    """Process group (the session of its boot) -> machine id, from every ``instance.json``."""
    found = {}
    for record in machines_root.glob("*/instance.json"):
        with contextlib.suppress(OSError, ValueError, TypeError):
            pgid = int(json.loads(record.read_text()).get("pgid") or 0)
            if pgid > 1:
                found[pgid] = record.parent.name
    return found


@dataclass
class MachineGroups:
    """Every machine process group the soak's run saw, read once a second."""

    machines_root: Path
    every_s: float = 1.0
    groups: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="machine-groups", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.read()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.read()

    def read(self) -> None:
        self.groups.update(machine_groups(self.machines_root))


def pid_file_pids(machines_root: Path) -> set[int]:
    """The pids in every machine's disk: ``agent.pid``, ``worker.pid``, each attempt's
    ``runner.json``."""
    pids = set()
    for disk in machines_root.glob("*/disk"):
        for name in PID_FILES:
            with contextlib.suppress(OSError, ValueError):
                pids.add(int((disk / name).read_text().strip()))
        for runner in disk.glob("attempts/*/runner.json"):
            with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
                pids.add(int(json.loads(runner.read_text())["pid"]))
    return {p for p in pids if p > 1}


def folders_pattern(folders: Iterable[Path]) -> re.Pattern[bytes]:
    """Matches a path in one of ``folders`` (or the folder itself), as bytes."""
    paths = {os.fsencode(str(p)) for f in folders for p in (f.absolute(), f.resolve())}
    if not paths:
        return re.compile(rb"(?!)")  # matches nothing
    return re.compile(b"(?:" + b"|".join(re.escape(p) for p in sorted(paths)) + rb")(?:/|\x00|$)")


def points_into(pid: int, pattern: re.Pattern[bytes]) -> bool:
    """Whether the process's command line, environment or working directory matches
    ``pattern`` (:func:`folders_pattern`)."""
    blobs = []
    for name in ("cmdline", "environ"):
        with contextlib.suppress(OSError):
            blobs.append((_PROC / str(pid) / name).read_bytes())
    with contextlib.suppress(OSError):
        blobs.append(os.fsencode(os.readlink(_PROC / str(pid) / "cwd")))
    return any(pattern.search(blob) for blob in blobs)


def _with_descendants(roots: set[int], table: dict[int, Proc]) -> set[int]:
    found = {p for p in roots if p in table}
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _ours_by_group(table: dict[int, Proc], groups: set[int], ours: Callable[[int], bool]) -> set[int]:
    """The members of every group or session in ``groups`` that is still the machines': one
    of its members is ``ours``. A group id is free again once its last process is gone, and
    a 60-minute soak on a host whose pid_max is 32768 may see another's group get it."""
    members: dict[int, set[int]] = {}
    for proc in table.values():
        for group in {proc.pgid, proc.sid} & groups:
            members.setdefault(group, set()).add(proc.pid)
    return {pid for pids in members.values() if any(ours(p) for p in pids) for pid in pids}


def machine_processes(machines_root: Path, groups: Iterable[int], table: dict[int, Proc]) -> set[int]:
    """The live processes of the machines under ``machines_root``: any whose command line,
    environment or working directory is in a machine's folder (the stand-in and everything
    it starts run there; a job process whose runner was killed names its attempt's
    folder), the members of every machine group or session in ``groups``, the processes of
    the disks' pid files, and every descendant of those (the stand-ins' children, job
    processes in sessions of their own). A group, or a pid file's pid, counts only while it
    is still the machines' (ids are reused)."""
    folders = [d for d in machines_root.iterdir() if d.is_dir()] if machines_root.is_dir() else []
    # Each machine's own folder, never the root: the control plane's services name the
    # root (GPUFLEET_LOCAL_ROOT) and are not the machines'.
    in_machine = folders_pattern(folders)
    roots = {pid for pid in table if points_into(pid, in_machine)}
    roots |= _ours_by_group(table, set(groups), roots.__contains__)
    in_root = folders_pattern([machines_root])
    roots |= {p for p in pid_file_pids(machines_root) if p in table and points_into(p, in_root)}
    return _with_descendants(roots, table) - {os.getpid(), 1}


def _signal(pids: Iterable[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def end_machines(machines_root: Path, groups: Iterable[int] = (), grace_s: float = 5.0) -> int:
    """End every local machine's processes (:func:`machine_processes`): each continued
    (SIGCONT: a paused agent cannot act on SIGTERM), SIGTERM, ``grace_s`` for them to go,
    then SIGKILL to what is left; how many processes there were. ``groups``: every machine
    group seen during the run (the records' current ones are added). Run it once nothing
    starts machines any more (the provisioner stopped)."""
    all_groups = set(groups) | set(machine_groups(machines_root))
    for disk in machines_root.glob("*/disk"):
        # The platform's kill, as the local driver records it: never charged to a job.
        with contextlib.suppress(OSError):
            (disk / "machine.stopping").write_text("the soak ended\n")
    ended: set[int] = set()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        signalled: set[int] = set()
        deadline = time.monotonic() + wait_s
        while True:
            # Looked for again each time: a stand-in restarts its agent until the signal
            # reaches it, a worker may start a runner.
            targets = machine_processes(machines_root, all_groups, process_table())
            ended |= targets
            fresh = targets - signalled
            _signal(fresh, signal.SIGCONT)
            _signal(fresh, sig)
            signalled |= fresh
            if not targets or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if not targets:
            break
    return len(ended)


def leftovers(state_dir: Path, groups: Iterable[int]) -> list[str]:
    """After the whole teardown: every live process whose command line, environment or
    working directory is in ``state_dir``, or that is in one of the machines' ``groups``
    (still theirs), killed (continued, then SIGKILL) and named, one line each. This
    process and the ones that started it are spared."""
    table = process_table()
    spared = {1}
    pid = os.getpid()
    while pid in table and pid not in spared:
        spared.add(pid)
        pid = table[pid].ppid
    in_state = folders_pattern([state_dir])
    found = {p for p in table if p not in spared and points_into(p, in_state)}
    found |= _ours_by_group(table, set(groups), found.__contains__) - spared
    lines = []
    for pid in sorted(found):
        cmd = ""
        with contextlib.suppress(OSError):
            cmd = (_PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        proc = table[pid]
        lines.append(
            f"pid {pid} (group {proc.pgid}, session {proc.sid}, parent {proc.ppid}): {cmd.strip()[:200]}"
        )
    _signal(found, signal.SIGCONT)
    _signal(found, signal.SIGKILL)
    return lines
