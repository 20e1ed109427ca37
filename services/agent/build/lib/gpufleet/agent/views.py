"""What the agent daemon reads from the state directory to answer its callers.

The daemon never launches or reaps a runner — the worker does — so everything it says
about jobs is read from the attempt folders: an attempt is running from the moment
StartJob accepted it until its result is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpufleet.agent.specs import JobSpec
from gpufleet.agent.statedir import AttemptFiles, StateDir, read_json, read_pid


@dataclass(frozen=True)
class RunnerView:
    """A launched attempt without a result yet, as ListRunners shows it."""

    spec: JobSpec
    runner_pid: int | None
    start_time: datetime | None


def _view(files: AttemptFiles) -> RunnerView | None:
    if files.result.exists():
        return None
    try:
        spec = JobSpec.load(files.spec)
    except (FileNotFoundError, KeyError, ValueError):
        return None
    state = read_json(files.runner_state)
    start = None
    if isinstance(state, dict) and state.get("start_time"):
        start = datetime.fromisoformat(str(state["start_time"]))
    return RunnerView(spec=spec, runner_pid=read_pid(files.runner_pid), start_time=start)


def running(state: StateDir) -> list[RunnerView]:
    """Launched attempts without a result, sorted by attempt id."""
    views = (_view(files) for files in state.attempt_folders())
    return [v for v in views if v is not None]


def pending(state: StateDir) -> list[JobSpec]:
    """Attempts accepted but not launched yet (the worker picks them up shortly)."""
    specs = []
    for attempt_id in state.pending_ids():
        try:
            specs.append(JobSpec.load(state.inbox_spec(attempt_id)))
        except (FileNotFoundError, KeyError, ValueError):
            continue  # launched between the listing and the read
    return specs


def active_specs(state: StateDir) -> list[JobSpec]:
    """Every attempt holding slots now: pending or running (one entry each, even when the
    worker launches it between the two reads)."""
    by_id = {spec.attempt_id: spec for spec in pending(state)}
    by_id.update((v.spec.attempt_id, v.spec) for v in running(state))
    return list(by_id.values())


def is_active(state: StateDir, attempt_id: str) -> bool:
    if state.inbox_spec(attempt_id).exists():
        return True
    files = state.attempt(attempt_id)
    return files.folder.is_dir() and not files.result.exists()
