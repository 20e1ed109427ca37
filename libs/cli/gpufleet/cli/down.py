"""``gpufleet down --state-dir D``: stop the stack that runs on a state folder — its
services and its local machines — from another terminal or a script.

The `gpufleet up` holding the folder's lock is asked to stop (SIGTERM: what Ctrl-C does),
and does it itself: its services, then its local machines, then the lock. What an `up`
that was killed left behind is found and ended here: services still running from the
folder (their working directory is the state folder), local machines with a live session.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpufleet.cli import local_machines, state_lock
from gpufleet.cli.credentials import DEFAULT_STATE_DIR
from gpufleet.cli.stack import SERVICES

_PROC = Path("/proc")


def services_left(state_dir: Path) -> dict[int, str]:
    """pid -> service name of gpufleet services running from ``state_dir`` (an `up` starts
    each as ``python -m gpufleet.<name>`` in the state folder)."""
    found: dict[int, str] = {}
    if not _PROC.is_dir():
        return found
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if cwd != state_dir:
            continue
        for i, arg in enumerate(argv[:-1]):
            name = argv[i + 1].decode(errors="replace").removeprefix("gpufleet.")
            if arg == b"-m" and name in SERVICES:
                found[int(entry.name)] = name
    return found


def _wait(done: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not done():
        if time.monotonic() >= deadline:
            return False
        pause.wait(0.1)  # real time: waiting on other processes
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_stack(state_dir: Path, timeout_s: float) -> list[str]:
    """Stop the stack on ``state_dir``; what was done, in words (empty: nothing ran)."""
    said: list[str] = []
    if state_lock.held(state_dir):
        pid = state_lock.holder_pid(state_dir)
        if pid is None:
            raise RuntimeError(f"{state_dir}'s lock is held but names no pid")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if _wait(lambda: not state_lock.held(state_dir), timeout_s):
            said.append(f"`gpufleet up` (pid {pid}) stopped its services and local machines")
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            said.append(f"`gpufleet up` (pid {pid}) did not stop within {timeout_s:g}s: killed")
    left = services_left(state_dir)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if left and not _wait(lambda: not any(_alive(p) for p in left), timeout_s):
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    if left:
        said.append("services left running stopped: " + ", ".join(f"{n} (pid {p})" for p, n in left.items()))
    machines = local_machines.stop_all(state_dir)
    if machines:
        said.append(f"{machines} local machine(s) stopped")
    return said


def run_down(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).resolve()
    if not state_dir.is_dir():
        print(f"gpufleet: no state folder {state_dir}", file=sys.stderr)
        return 1
    said = stop_stack(state_dir, args.timeout)
    if not said:
        print(f"nothing runs on {state_dir}")
    for line in said:
        print(line)
    return 0


def add_parser(sub: Any) -> None:
    down = sub.add_parser(
        "down", help="stop the stack on a state folder: its `gpufleet up`, services and local machines"
    )
    down.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="the folder `up` ran on (default ./var)")
    down.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for `up` to stop before killing it"
    )
    down.set_defaults(func=run_down)
