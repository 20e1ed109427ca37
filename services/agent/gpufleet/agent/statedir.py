"""The agent's state directory: the only channel between the agent, the worker and runners.

Every hand-off between these processes is a file, written to a temporary name and renamed
into place, so a reader never sees half a file and a process killed at any point leaves
either the old state or the new one. That is what lets any of them die and restart
without losing a job: the folder is the truth, memory is only a cache of it.

Layout (``<state_dir>/``)::

    agent.port  agent.pid          the daemon, once it serves (the local driver waits for them)
    worker.pid  worker.lock        the live worker (the lock guarantees there is one)
    worker.log                     the worker's own log
    startup.error                  start-up failed; its text is Probe's startup_error
    walls.error                    the walls between slots cannot be built here (same effect)
    machine.stopping               the machine is being stopped: its jobs' deaths are ours
    inbox/<attempt>.json           StartJob -> worker: a job to launch
    cancel/<attempt>               CancelJob -> worker: its text is the reason
    attempts/<attempt>/            one per launched attempt (see ``AttemptFiles``); its
                                   ``platform_kill`` says the platform killed its job
                                   (``gpufleet.agent.platform_kills``), its ``lease`` when
                                   the scheduler last renewed it (``gpufleet.agent.lease``)
    finished/<attempt>/            the scheduler acknowledged its completion
    refused/<attempt>/             the scheduler refused its completion for good
"""

from __future__ import annotations

import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Attempt ids become folder names: a strict alphabet keeps "../" and friends out.
ATTEMPT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` so that readers see the old file or the whole new one, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, doc: Any) -> None:
    atomic_write_text(path, json.dumps(doc, ensure_ascii=False, sort_keys=True, indent=1))


def read_json(path: Path) -> Any | None:
    """The document at ``path``, or None when there is none (yet)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def read_pid(path: Path) -> int | None:
    """The pid recorded in a pid file, or None when absent or unreadable."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class AttemptFiles:
    """The files of one attempt's folder, written by the worker and the attempt's runner."""

    folder: Path

    @property
    def attempt_id(self) -> str:
        return self.folder.name

    @property
    def spec(self) -> Path:
        """The job spec (worker); also the file the job reads through GPUFLEET_JOB_SPEC."""
        return self.folder / "spec.json"

    @property
    def runner_pid(self) -> Path:
        return self.folder / "runner.pid"

    @property
    def runner_state(self) -> Path:
        """The runner's start time and the job's pid, once the job is started."""
        return self.folder / "runner.json"

    @property
    def runner_log(self) -> Path:
        return self.folder / "runner.log"

    @property
    def job_log(self) -> Path:
        """The job's stdout and stderr."""
        return self.folder / "job.log"

    @property
    def cancel(self) -> Path:
        """Present once the attempt must stop; its text is the reason."""
        return self.folder / "cancel"

    @property
    def lease(self) -> Path:
        """The attempt's last renewal (worker): its runner stops the job when it is stale."""
        return self.folder / "lease"

    @property
    def result(self) -> Path:
        """The runner's verdict (or the worker's, for a runner that died without one)."""
        return self.folder / "result.json"

    @property
    def work(self) -> Path:
        """The job's working folder, removed when the job ends."""
        return self.folder / "work"


class StateDir:
    """Paths inside the state directory, and the few operations every process shares."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def ensure(self) -> StateDir:
        for folder in (self.root, self.inbox, self.cancels, self.attempts, self.finished, self.refused):
            folder.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def agent_port(self) -> Path:
        return self.root / "agent.port"

    @property
    def agent_pid(self) -> Path:
        return self.root / "agent.pid"

    @property
    def worker_pid(self) -> Path:
        return self.root / "worker.pid"

    @property
    def worker_lock(self) -> Path:
        return self.root / "worker.lock"

    @property
    def worker_log(self) -> Path:
        return self.root / "worker.log"

    @property
    def startup_error(self) -> Path:
        return self.root / "startup.error"

    @property
    def walls_error(self) -> Path:
        return self.root / "walls.error"

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    @property
    def cancels(self) -> Path:
        return self.root / "cancel"

    @property
    def attempts(self) -> Path:
        return self.root / "attempts"

    @property
    def finished(self) -> Path:
        return self.root / "finished"

    @property
    def refused(self) -> Path:
        return self.root / "refused"

    def inbox_spec(self, attempt_id: str) -> Path:
        return self.inbox / f"{attempt_id}.json"

    def cancel_request(self, attempt_id: str) -> Path:
        return self.cancels / attempt_id

    def attempt(self, attempt_id: str) -> AttemptFiles:
        return AttemptFiles(self.attempts / attempt_id)

    def known(self, attempt_id: str) -> bool:
        """Whether this machine has ever accepted the attempt (pending, running or ended)."""
        return any(
            p.exists()
            for p in (
                self.inbox_spec(attempt_id),
                self.attempts / attempt_id,
                self.finished / attempt_id,
                self.refused / attempt_id,
            )
        )

    def pending_ids(self) -> list[str]:
        """Attempts accepted by StartJob that the worker has not launched yet."""
        return sorted(p.stem for p in self.inbox.glob("*.json") if ATTEMPT_ID_PATTERN.match(p.stem))

    def attempt_folders(self) -> list[AttemptFiles]:
        """Launched attempts whose completion the scheduler has not acknowledged yet."""
        return [
            AttemptFiles(p)
            for p in sorted(self.attempts.iterdir())
            if p.is_dir() and ATTEMPT_ID_PATTERN.match(p.name)
        ]
