"""The seam where the walls between tenants go (DESIGN §10).

A runner never starts a job directly: it asks a :class:`SlotLauncher` to open the slot,
and the :class:`OpenSlot` it gets back says how to start the job behind the slot's walls
(argv, environment, what the child does between fork and exec), how to signal everything
the job started, and how to wipe the slot when the job ends. Two launchers exist:

- :class:`gpufleet.agent.walls.launcher.WalledLauncher` — the default: its own user,
  namespaces, cgroup, closed network, own GPU, clean before and after;
- :class:`CurrentUserLauncher` — no walls, for a development machine without root
  (``GPUFLEET_WALLS=off``, said loudly in the agent's log): the job runs as the agent's
  user in a process group of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from gpufleet.agent.specs import JobSpec
from gpufleet.agent.statedir import AttemptFiles
from gpufleet.agent.walls.wipe import remove_tree

PIPELINE_PLACEHOLDER = "{pipeline_dir}"


class SlotError(Exception):
    """The slot could not be opened or closed: the job must not run, and is not charged."""


class OpenSlot(Protocol):
    """One attempt's slot, open: how to run the job inside it and how to close it."""

    @property
    def job_dir(self) -> Path:
        """The job's folder on the host (the runner's working directory for the child)."""
        ...

    def command(self, pipeline_command: Sequence[str]) -> list[str]:
        """The full argv that runs the pipeline command inside the slot."""
        ...

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """The job's environment; ``base`` is what the runner would pass unwalled."""
        ...

    def preexec(self) -> Callable[[], None] | None:
        """Runs in the child between fork and exec (joining the cgroup), or None."""
        ...

    def signal(self, job_pid: int, signum: signal.Signals) -> None:
        """Signal every process the job started (already gone is fine)."""
        ...

    def out_of_memory(self) -> bool:
        """Whether the kernel killed a process of the job at its memory limit (False when
        the slot has no limit of its own to say so)."""
        ...

    def close(self) -> None:
        """Kill what is left and wipe the slot, whatever happened (idempotent)."""
        ...

    def give(self, path: Path) -> None:
        """Make ``path`` (made by the runner in the job's folder before the job starts)
        and what is below it the job's own."""
        ...


class SlotLauncher(Protocol):
    """Puts one job behind its slot's walls."""

    name: str

    def open_slot(self, spec: JobSpec, files: AttemptFiles, pipeline_dir: Path) -> OpenSlot:
        """Prepare the slot; raise SlotError if it cannot be closed off — the runner then
        reports INFRA_ERROR (uncharged, ``slot_could_not_be_closed``) without starting it."""
        ...

    def reclaim(self, spec: JobSpec, files: AttemptFiles) -> None:
        """Close the slot of an attempt whose runner died (the worker calls this)."""
        ...


def expand_pipeline_command(command: Sequence[str], pipeline_dir: Path) -> list[str]:
    """The configured argv with ``{pipeline_dir}`` replaced; nothing else is interpreted."""
    return [part.replace(PIPELINE_PLACEHOLDER, str(pipeline_dir)) for part in command]


class _ProcessGroupSlot:
    def __init__(self, files: AttemptFiles, pipeline_dir: Path) -> None:
        self.files = files
        self.pipeline_dir = pipeline_dir
        files.work.mkdir(exist_ok=True)

    @property
    def job_dir(self) -> Path:
        return self.files.work

    def command(self, pipeline_command: Sequence[str]) -> list[str]:
        return expand_pipeline_command(pipeline_command, self.pipeline_dir)

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        return {**base, "GPUFLEET_PIPELINE_DIR": str(self.pipeline_dir)}

    def preexec(self) -> Callable[[], None] | None:
        return None

    def signal(self, job_pid: int, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job_pid, signum)

    def out_of_memory(self) -> bool:
        return False

    def close(self) -> None:
        remove_tree(self.files.work)

    def give(self, path: Path) -> None:
        """The job runs as the runner's own user: it owns the folder already."""


class CurrentUserLauncher:
    """No walls: the job runs as the agent's user, in a process group of its own."""

    name = "current-user"

    def open_slot(self, spec: JobSpec, files: AttemptFiles, pipeline_dir: Path) -> OpenSlot:
        return _ProcessGroupSlot(files, pipeline_dir)

    def reclaim(self, spec: JobSpec, files: AttemptFiles) -> None:
        remove_tree(files.work)
