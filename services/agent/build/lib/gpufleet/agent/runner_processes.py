"""Starting runner processes and telling whether one still runs.

Behind a small protocol so the worker's bookkeeping is unit-tested without processes.
A runner is recognised by its command line, which names its own spec file: no other
process on the machine carries that path, so a reused pid is never taken for it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import Protocol

from gpufleet.agent.procs import is_alive
from gpufleet.agent.statedir import AttemptFiles

RUNNER_MODULE = "gpufleet.agent.runner"


class RunnerProcesses(Protocol):
    def spawn(self, files: AttemptFiles) -> int:
        """Start the runner of the attempt in ``files``; returns its pid."""
        ...

    def alive(self, files: AttemptFiles, pid: int | None) -> bool:
        """Whether ``pid`` is that attempt's runner and still runs."""
        ...


class PopenRunnerProcesses:
    """Runners as child processes of the worker, in the machine's process group.

    They stay in the group (no new session) so stopping the machine stops them, and they
    are not killed when the worker exits, so a worker restart finds them running.
    """

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self, files: AttemptFiles) -> int:
        with open(files.runner_log, "ab") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", RUNNER_MODULE, str(files.spec)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        self._children[child.pid] = child
        return child.pid

    def alive(self, files: AttemptFiles, pid: int | None) -> bool:
        child = self._children.get(pid) if pid is not None else None
        if child is not None and child.poll() is not None:  # reaps our own exited child
            del self._children[child.pid]
            return False
        return is_alive(pid, cmdline=(RUNNER_MODULE, str(files.spec)))
