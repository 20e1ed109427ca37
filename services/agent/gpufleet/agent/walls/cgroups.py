"""Its own cgroup: a memory and a pids limit per job, and a way to kill it whole.

Machines differ: a GPU image usually mounts cgroup v2 alone at ``/sys/fs/cgroup``; this
project's build machines are a v1/v2 hybrid (v1 ``pids`` and ``memory`` hierarchies, and a
controller-less cgroup2 at ``/sys/fs/cgroup/unified`` whose ``cgroup.kill`` still works).
So the layout is detected from ``/proc/self/mounts`` and ``/proc/self/cgroup``, never assumed.

Where a job's cgroup goes:

- **v1**: in each hierarchy, *below the cgroup the agent itself lives in*
  (``<own>/gpufleet-jobs-<walls name>/<attempt>``). The agent's own cgroup is never written to — no
  limit set, no process moved — and, hierarchy being on, a job stays counted in the limits
  of whatever contains the agent (a test run's memory cgroup, say).
- **v2**: the no-internal-process rule forbids enabling controllers below a cgroup that
  holds processes, so jobs go below a cgroup of their own at the root of the hierarchy
  (``/gpufleet-jobs-<walls name>/<attempt>``; the root may enable controllers for
  children), or below ``cgroup_parent`` when set (a systemd ``Delegate=yes`` unit's subtree).

The jobs' group carries the machine's walls name (:mod:`gpufleet.common.host_names`): two
agents on one host — two stacks, a stack and a test run — never make, empty or remove each
other's, whatever cgroup they were started in.

A job joins its cgroup before it can fork (the runner's child writes itself into
``cgroup.procs`` between fork and exec), so nothing it starts — double fork, ``setsid``,
``nohup`` — is outside it. Killing uses ``cgroup.kill`` where any cgroup2 hierarchy
offers it, and otherwise signals every member until none is left (bounded by pids.max).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

JOBS_GROUP = "gpufleet-jobs"


class CgroupError(Exception):
    """A job's cgroup cannot be made: the slot cannot be closed."""


@dataclass(frozen=True)
class Mount:
    """One mounted cgroup hierarchy: cgroup2, or v1 with the controllers it carries."""

    path: Path
    version: int
    controllers: frozenset[str]


@dataclass(frozen=True)
class CgroupLayout:
    """Which hierarchy holds each job's limits and which one can kill it."""

    memory: Path  # the folder below which job cgroups go, in the hierarchy with memory
    pids: Path
    kill: Path | None  # a cgroup2 folder below which ``cgroup.kill`` works, if any
    version: int  # 2: memory and pids in one cgroup2 folder; 1: v1 hierarchies
    # The folders above are the agent's own jobs group (made on first use, removed by the
    # last job out), not a configured parent it was delegated.
    own_group: bool = True

    def describe(self) -> str:
        kill = f", kill via {self.kill}" if self.kill else ", kill by signalling members"
        if self.version == 2:
            return f"cgroup v2 at {self.memory}{kill}"
        return f"cgroup v1 (memory {self.memory}, pids {self.pids}){kill}"


def parse_mounts(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        fstype, target, options = parts[2], Path(parts[1]), set(parts[3].split(","))
        if fstype == "cgroup2":
            mounts.append(Mount(target, 2, frozenset()))
        elif fstype == "cgroup":
            mounts.append(Mount(target, 1, frozenset(options & {"memory", "pids", "freezer", "devices"})))
    return mounts


def parse_own_cgroups(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` as controller -> path ("" for the cgroup2 entry)."""
    own: dict[str, str] = {}
    for line in text.splitlines():
        _, controllers, path = line.split(":", 2)
        for name in controllers.split(",") if controllers else [""]:
            own[name] = path
    return own


def detect_layout(
    mounts: Iterable[Mount],
    own: dict[str, str],
    read: Callable[[Path], str],
    parent: str = "",
    group: str = JOBS_GROUP,
) -> CgroupLayout:
    """Where job cgroups go on this machine, below the machine's own ``group``; pure apart
    from ``read`` (tested from tables)."""
    mounts = list(mounts)
    v2 = [m for m in mounts if m.version == 2]
    v1_memory = next((m for m in mounts if m.version == 1 and "memory" in m.controllers), None)
    v1_pids = next((m for m in mounts if m.version == 1 and "pids" in m.controllers), None)
    # Every cgroup2 hierarchy (kernel >= 5.14) offers cgroup.kill below its root, even with
    # no controller enabled; a kernel without it falls back to signalling (see kill()).
    kill_root = v2[0] if v2 else None
    for mount in v2:
        available = set(read(mount.path / "cgroup.controllers").split())
        if {"memory", "pids"} <= available:
            base = mount.path / (parent.strip("/") or group)
            return CgroupLayout(memory=base, pids=base, kill=base, version=2, own_group=not parent.strip("/"))
    if v1_memory is None or v1_pids is None:
        raise CgroupError("no cgroup hierarchy offers both the memory and the pids controller")
    memory = v1_memory.path / own.get("memory", "/").strip("/") / group
    pids = v1_pids.path / own.get("pids", "/").strip("/") / group
    kill = kill_root.path / own.get("", "/").strip("/") / group if kill_root else None
    return CgroupLayout(memory=memory, pids=pids, kill=kill, version=1)


def _read(path: Path) -> str:
    return path.read_text()


def machine_layout(parent: str = "", group: str = JOBS_GROUP) -> CgroupLayout:
    """This machine's layout, from /proc, its jobs below ``group``."""
    try:
        mounts = parse_mounts(Path("/proc/self/mounts").read_text())
        own = parse_own_cgroups(Path("/proc/self/cgroup").read_text())
    except OSError as err:
        raise CgroupError(f"cannot read the cgroup mounts: {err}") from err
    return detect_layout(mounts, own, _read, parent, group)


@dataclass
class JobCgroup:
    """One attempt's cgroup folders (one per hierarchy used) and their limits."""

    layout: CgroupLayout
    name: str
    folders: list[Path] = field(default_factory=list)

    @property
    def memory(self) -> Path:
        return self.layout.memory / self.name

    @property
    def pids(self) -> Path:
        return self.layout.pids / self.name

    @property
    def kill_folder(self) -> Path | None:
        return self.layout.kill / self.name if self.layout.kill else None

    def create(self, memory_bytes: int, pids_max: int) -> None:
        """Make the folders and set the limits; CgroupError if any step fails."""
        if memory_bytes <= 0 or pids_max <= 0:
            raise CgroupError("a job needs a positive memory and pids limit")
        wanted = [self.memory, self.pids]
        if self.kill_folder is not None:
            wanted.append(self.kill_folder)
        try:
            for folder in dict.fromkeys(wanted):
                for tries_left in (2, 1, 0):
                    if self.layout.own_group:
                        self._ensure_parent(folder.parent)
                    try:
                        folder.mkdir(exist_ok=True)
                        break
                    except FileNotFoundError:  # another job's clean-up removed the parent
                        if not tries_left:
                            raise
                self.folders.append(folder)
            if self.layout.version == 2:
                _write(self.memory / "memory.max", str(memory_bytes))
                with contextlib.suppress(FileNotFoundError):
                    _write(self.memory / "memory.swap.max", "0")
                _write(self.pids / "pids.max", str(pids_max))
            else:
                _write(self.memory / "memory.limit_in_bytes", str(memory_bytes))
                with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to cap
                    _write(self.memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
                _write(self.pids / "pids.max", str(pids_max))
        except OSError as err:
            raise CgroupError(f"cannot set up cgroup {self.name}: {err}") from err

    def _ensure_parent(self, parent: Path) -> None:
        parent.mkdir(exist_ok=True)
        if self.layout.version == 2 and parent == self.layout.memory:
            root_control = parent.parent / "cgroup.subtree_control"
            enabled = set(_read(root_control).split())
            if not {"memory", "pids"} <= enabled:
                _write(root_control, "+memory +pids")
            child_control = parent / "cgroup.subtree_control"
            if not {"memory", "pids"} <= set(_read(child_control).split()):
                _write(child_control, "+memory +pids")

    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a new job writes itself into (between fork and exec)."""
        return [str(folder / "cgroup.procs") for folder in dict.fromkeys(self.folders)]

    def members(self) -> list[int]:
        pids: set[int] = set()
        for folder in dict.fromkeys(self.folders):
            with contextlib.suppress(FileNotFoundError):
                pids.update(int(p) for p in _read(folder / "cgroup.procs").split())
        return sorted(pids)

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed at its memory limit (0 when the
        kernel does not say): such a death is the job's own, not the platform's."""
        for name in ("memory.events", "memory.oom_control"):  # v2, v1 (kernel >= 4.13)
            try:
                text = _read(self.memory / name)
            except OSError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
        return 0

    def signal(self, signum: signal.Signals) -> None:
        for pid in self.members():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def kill(self, timeout_s: float = 10.0) -> bool:
        """SIGKILL every member until none is left; True once the cgroup is empty."""
        deadline = time.monotonic() + timeout_s
        while True:
            kill_folder = self.kill_folder
            if kill_folder is not None and kill_folder.exists():
                with contextlib.suppress(OSError):
                    _write(kill_folder / "cgroup.kill", "1")
            self.signal(signal.SIGKILL)
            if not self.members():
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)  # real time: the kernel is tearing processes down

    def remove(self) -> None:
        """Kill what is left and remove the folders (idempotent)."""
        self.kill()
        for folder in reversed(list(dict.fromkeys(self.folders or self._all_folders()))):
            for _ in range(100):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)  # members still exiting
            if self.layout.own_group:
                # Leave nothing behind in a hierarchy we share: the last job out removes the
                # jobs folder (another job's folder inside it makes this fail, harmlessly).
                with contextlib.suppress(OSError):
                    folder.parent.rmdir()
        self.folders.clear()

    def _all_folders(self) -> list[Path]:
        folders = [self.memory, self.pids]
        if self.kill_folder is not None:
            folders.append(self.kill_folder)
        return [f for f in folders if f.exists()]

    def adopt(self) -> JobCgroup:
        """Pick up the folders of an attempt whose runner died (for clean-up)."""
        self.folders = self._all_folders()
        return self


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)
