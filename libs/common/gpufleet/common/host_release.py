"""Giving back what a machine took on its host: its slot users, its walls folder and the
cgroup group its jobs' cgroups went in (a job whose runner was killed leaves its own).

A local machine's walls name is its stack's and its number's (:mod:`.host_names`), so a
destroyed machine's users and folder would otherwise stay on the host for good, and each
test run's stack would add more (system user ids run out below 1000). The local driver
gives them back when it destroys a machine; a test gives back every machine of its
stack when it ends. Only names built from the machine's own walls name are touched:
never another stack's, never another machine's.

Users are removed with ``userdel``/``groupdel`` from argv lists after every process of
theirs is killed (a user id handed to the next user with processes still running under it
would give them to that user).
"""

from __future__ import annotations

import contextlib
import grp
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from gpufleet.common.host_names import WALLS_BASE, HostNames, stack_walls_prefix

log = logging.getLogger(__name__)


def processes_of(uid: int, proc: Path = Path("/proc")) -> list[int]:
    """Live pids whose real or effective uid is ``uid`` (zombies run nothing: skipped)."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        for line in status.splitlines():
            if line.startswith("State:") and line.split()[1] in ("Z", "X"):
                break
            if line.startswith("Uid:"):
                real, effective = (int(v) for v in line.split()[1:3])
                if uid in (real, effective):
                    found.append(int(entry.name))
                break
    return found


def kill_processes_of(uid: int, timeout_s: float = 5.0) -> int:
    """SIGKILL every process of ``uid`` until none is left; how many were killed."""
    if uid == 0:
        raise ValueError("refusing to kill root's processes")
    killed = 0
    deadline = time.monotonic() + timeout_s
    while pids := processes_of(uid):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)  # real time: let the kernel reap them
    return killed


def users_matching(pattern: re.Pattern[str]) -> list[pwd.struct_passwd]:
    return sorted((u for u in pwd.getpwall() if pattern.fullmatch(u.pw_name)), key=lambda u: u.pw_name)


def release(names: HostNames) -> list[str]:
    """Remove one machine's slot users and walls folder; what could not be removed (empty
    when everything is gone, or was never there)."""
    slot_users = re.compile(re.escape(names.slot_user_prefix) + r"[0-9]+")
    problems = [problem for user in users_matching(slot_users) if (problem := remove_user(user))]
    problems += _remove_folder(names.walls_root)
    problems += remove_cgroups(re.compile(re.escape(names.jobs_cgroup)))
    return problems


def release_stack(local_root: Path) -> list[str]:
    """Every local machine of one stack (the machines of ``local_root``), whatever its number:
    for a stack whose machines were ended without being destroyed (a test's teardown)."""
    prefix = stack_walls_prefix(local_root)
    machine = re.escape(prefix) + r"[0-9]+"
    slot_users = re.compile(f"gf{machine}-s[0-9]+")
    problems = [problem for user in users_matching(slot_users) if (problem := remove_user(user))]
    if WALLS_BASE.is_dir():
        for folder in sorted(WALLS_BASE.iterdir()):
            if re.fullmatch(machine, folder.name):
                problems += _remove_folder(folder)
    problems += remove_cgroups(re.compile(f"gpufleet-jobs-{machine}"))
    return problems


def remove_cgroups(
    group: re.Pattern[str], mounts: Path = Path("/proc/self/mounts"), depth: int = 6
) -> list[str]:
    """Remove every cgroup folder whose name matches ``group`` — in each mounted hierarchy,
    wherever the agent that made it lived (v1 puts them below the agent's own cgroup) — with
    the job cgroups inside, killing what still runs in them."""
    problems: list[str] = []
    for root in _cgroup_roots(mounts):
        for folder in _folders_named(root, group, depth):
            for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()):
                problems += _remove_cgroup(child)
            problems += _remove_cgroup(folder)
    return problems


def _cgroup_roots(mounts: Path) -> list[Path]:
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return []
    return [
        Path(p[1]) for p in (line.split() for line in lines) if len(p) > 2 and p[2] in ("cgroup", "cgroup2")
    ]


def _folders_named(root: Path, name: re.Pattern[str], depth: int) -> list[Path]:
    found: list[Path] = []
    level = [root]
    for _ in range(depth):
        below: list[Path] = []
        for folder in level:
            try:
                children = [p for p in folder.iterdir() if p.is_dir() and not p.is_symlink()]
            except OSError:
                continue
            for child in children:
                (found if name.fullmatch(child.name) else below).append(child)
        level = below
    return found


def _remove_cgroup(folder: Path) -> list[str]:
    """Kill its members, then remove it (the kernel lets an empty cgroup go)."""
    for _ in range(100):
        try:
            members = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []
        except (OSError, ValueError):
            members = []
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            folder.rmdir()
            return []
        except FileNotFoundError:
            return []
        except OSError:
            time.sleep(0.01)  # real time: members still exiting
    return [f"{folder}: still has members"]


def remove_user(user: pwd.struct_passwd) -> str:
    """Kill the user's processes and remove it and its group; "" once gone, else why not."""
    if user.pw_uid == 0:
        return f"{user.pw_name}: is root"
    kill_processes_of(user.pw_uid)
    problem = _run(["userdel", user.pw_name])
    with contextlib.suppress(KeyError):
        grp.getgrnam(user.pw_name)  # userdel keeps the group when it is not the user's own
        problem = problem or _run(["groupdel", user.pw_name])
    if not problem:
        log.info("removed slot user %s (uid %d)", user.pw_name, user.pw_uid)
    return problem


def _remove_folder(folder: Path) -> list[str]:
    problems: list[str] = []

    def failed(_function: object, path: str, info: tuple[type[BaseException], BaseException, object]) -> None:
        problems.append(f"{path}: {info[1]}")

    # rmtree never follows a link a job planted: it removes the link.
    if folder.exists() or folder.is_symlink():
        shutil.rmtree(folder, onerror=failed)
    return problems


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{argv[0]} {argv[-1]}: {err}"
    if done.returncode != 0:
        return f"{argv[0]} {argv[-1]}: {done.stderr.strip() or done.returncode}"
    return ""
