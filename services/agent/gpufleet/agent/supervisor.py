"""The agent's side of the worker: start it once, adopt it after an agent restart, and
say truthfully whether it is alive — but never bring it back.

A worker that dies behind a live agent must stay dead and visible (Probe says
``worker_alive=false``, heartbeats stop): that is the case the went-silent net and lease
expiry exist for. Resurrecting it here would hide a wedged machine from them.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from gpufleet.agent.procs import is_alive
from gpufleet.agent.statedir import StateDir, read_pid
from gpufleet.agent.worker import WORKER_MODULE

log = logging.getLogger(__name__)


class WorkerWatch(Protocol):
    """What the daemon's answers need to know about the worker."""

    ever_alive: bool

    def alive(self) -> bool: ...

    def exit_code(self) -> int | None: ...


class WorkerSupervisor:
    """Knows this machine's worker by the pid it recorded and its command line."""

    def __init__(self, state: StateDir, env: Mapping[str, str]) -> None:
        self.state = state
        self.env = dict(env)
        self.ever_alive = False
        self._child: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [sys.executable, "-m", WORKER_MODULE, "--state-dir", str(self.state.root)]

    def alive(self) -> bool:
        if self._child is not None:
            self._child.poll()  # reap our own child, so a dead worker is not a live zombie
        pid = read_pid(self.state.worker_pid)
        alive = is_alive(pid, cmdline=(WORKER_MODULE, str(self.state.root)))
        self.ever_alive = self.ever_alive or alive
        return alive

    def exit_code(self) -> int | None:
        """The exit code of the worker this agent started, once it has exited."""
        return self._child.poll() if self._child is not None else None

    def start_unless_alive(self) -> bool:
        """Start the worker unless one already runs (adopted); True when started here."""
        if self.alive():
            log.info("adopting the running worker (pid %s)", read_pid(self.state.worker_pid))
            return False
        with open(self.state.worker_log, "ab") as worker_log:
            # Same process group as the agent: stopping the machine stops it too.
            self._child = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=worker_log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        log.info("worker started as pid %d", self._child.pid)
        return True

    def wait_until_alive(self, timeout_s: float) -> bool:
        """Block (real time, bounded) until the worker has recorded itself or has exited."""
        pause = threading.Event()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.alive():
                return True
            if self.exit_code() is not None:
                return False
            pause.wait(0.05)
        return self.alive()


def pipeline_resolvable(command: Sequence[str]) -> bool:
    """Whether the pipeline's program exists and can be executed here."""
    program = command[0]
    if "/" in program:
        path = Path(program)
        return path.is_file() and os.access(path, os.X_OK)
    return shutil.which(program) is not None


def startup_status(
    state: StateDir, supervisor: WorkerWatch, pipeline_command: Sequence[str]
) -> tuple[bool, str]:
    """``(startup_complete, startup_error)`` as Probe reports them.

    A ``startup.error`` file wins: whatever prepares the machine (and a test) writes it to
    say start-up failed. Then the pipeline must be runnable, and the worker must have come
    up at least once. An error stays empty while start-up is merely still in progress.
    """
    try:
        injected = state.startup_error.read_text(encoding="utf-8").strip()
        return False, injected or "start-up failed (no details recorded)"
    except FileNotFoundError:
        pass
    try:
        walls = state.walls_error.read_text(encoding="utf-8").strip()
        return False, f"the walls between slots cannot be built: {walls}"
    except FileNotFoundError:
        pass
    if not pipeline_resolvable(pipeline_command):
        return False, f"pipeline command not found or not executable: {pipeline_command[0]}"
    if supervisor.ever_alive or supervisor.alive():
        return True, ""
    code = supervisor.exit_code()
    if code is not None:
        return False, f"the worker exited with code {code} during start-up; see {state.worker_log}"
    return False, ""
