"""The worker's tick, on a manual clock, with a fake scheduler peer and fake runner
processes: launching, adoption, settling dead runners, retries, heartbeat cadence."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

import pytest

from gpufleet.agent.lease import Renewal, read_renewal
from gpufleet.agent.reporter import HeartbeatAnswer, ReportRefused, Running
from gpufleet.agent.specs import AttemptResult, Outcome
from gpufleet.agent.statedir import AttemptFiles, StateDir
from gpufleet.agent.worker import Worker
from gpufleet.common.clock import ManualClock
from gpufleet.common.errors import Unavailable
from tests.unit.agent.factories import spec, state_dir

HEARTBEAT_S = 10.0
RETRY_S = 1.0


class FakeReports:
    def __init__(self) -> None:
        self.heartbeats: list[tuple[datetime, list[Running]]] = []
        self.completions: list[AttemptResult] = []
        self.cancel_next: list[str] = []
        self.heartbeat_error: Exception | None = None
        self.complete_errors: list[Exception] = []
        # The lease the scheduler grants, as its answer states it (0: does not say).
        self.lease_s = 90.0

    def heartbeat(self, running: Sequence[Running], now: datetime) -> HeartbeatAnswer:
        if self.heartbeat_error:
            raise self.heartbeat_error
        self.heartbeats.append((now, list(running)))
        cancel, self.cancel_next = self.cancel_next, []
        return HeartbeatAnswer(cancel, self.lease_s)

    def complete(self, result: AttemptResult) -> None:
        self.completions.append(result)
        if self.complete_errors:
            raise self.complete_errors.pop(0)


class FakeProcesses:
    def __init__(self) -> None:
        self.spawned: list[str] = []
        self.live: set[int] = set()
        self._next_pid = 1000

    def spawn(self, files: AttemptFiles) -> int:
        self._next_pid += 1
        self.spawned.append(files.attempt_id)
        self.live.add(self._next_pid)
        return self._next_pid

    def alive(self, files: AttemptFiles, pid: int | None) -> bool:
        return pid in self.live


@pytest.fixture
def state(tmp_path: Path) -> StateDir:
    return state_dir(tmp_path)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def reports() -> FakeReports:
    return FakeReports()


@pytest.fixture
def processes() -> FakeProcesses:
    return FakeProcesses()


@pytest.fixture
def worker(state: StateDir, clock: ManualClock, reports: FakeReports, processes: FakeProcesses) -> Worker:
    return Worker(state, clock, reports, processes, heartbeat_s=HEARTBEAT_S, completion_retry_s=RETRY_S)


def accept(state: StateDir, attempt_id: str, slot: int = 0) -> None:
    """What StartJob leaves in the inbox."""
    spec(attempt_id, slot=slot).save(state.inbox_spec(attempt_id))


def finish(
    state: StateDir, processes: FakeProcesses, attempt_id: str, outcome: Outcome = Outcome.SUCCEEDED
) -> None:
    """The runner writes its verdict and exits."""
    files = state.attempt(attempt_id)
    AttemptResult(attempt_id, outcome, slot_seconds=12.0).save(files.result)
    processes.live.discard(int(files.runner_pid.read_text()))


def test_an_accepted_job_is_launched_once_and_heartbeated(
    worker: Worker, state: StateDir, processes: FakeProcesses, reports: FakeReports
) -> None:
    accept(state, "a-1", slot=2)
    worker.tick()
    assert processes.spawned == ["a-1"]
    files = state.attempt("a-1")
    assert files.spec.exists() and files.runner_pid.read_text() == "1001\n"
    assert state.pending_ids() == []
    assert reports.heartbeats[-1][1] == [Running("a-1", 2)]
    accept(state, "a-1", slot=2)  # a StartJob that raced the launch
    worker.tick()
    assert processes.spawned == ["a-1"]
    assert state.pending_ids() == []


def test_heartbeats_follow_the_clock(worker: Worker, clock: ManualClock, reports: FakeReports) -> None:
    worker.tick()
    worker.tick()
    assert len(reports.heartbeats) == 1  # the first one at once, then on the cadence
    clock.advance(HEARTBEAT_S - 1)
    worker.tick()
    assert len(reports.heartbeats) == 1
    clock.advance(1)
    worker.tick()
    assert len(reports.heartbeats) == 2


def test_a_failed_heartbeat_waits_for_the_next_period(
    worker: Worker, clock: ManualClock, reports: FakeReports
) -> None:
    reports.heartbeat_error = Unavailable("scheduler down")
    worker.tick()
    reports.heartbeat_error = None
    worker.tick()
    assert reports.heartbeats == []
    clock.advance(HEARTBEAT_S)
    worker.tick()
    assert len(reports.heartbeats) == 1


def test_an_ended_attempt_is_reported_then_filed_away(
    worker: Worker, state: StateDir, processes: FakeProcesses, reports: FakeReports
) -> None:
    accept(state, "a-1")
    worker.tick()
    finish(state, processes, "a-1")
    worker.tick()
    assert [(r.attempt_id, r.outcome, r.slot_seconds) for r in reports.completions] == [
        ("a-1", Outcome.SUCCEEDED, 12.0)
    ]
    assert (state.finished / "a-1" / "result.json").exists()
    assert state.attempt_folders() == []
    worker.tick()
    assert len(reports.completions) == 1


def test_an_unacknowledged_completion_is_retried_with_back_off(
    worker: Worker, state: StateDir, clock: ManualClock, processes: FakeProcesses, reports: FakeReports
) -> None:
    accept(state, "a-1")
    worker.tick()
    finish(state, processes, "a-1")
    reports.complete_errors = [Unavailable("down"), Unavailable("down")]
    worker.tick()  # first try fails: retry after RETRY_S
    worker.tick()
    assert len(reports.completions) == 1
    clock.advance(RETRY_S)
    worker.tick()  # second try fails: retry after 2 * RETRY_S
    clock.advance(RETRY_S)
    worker.tick()
    assert len(reports.completions) == 2
    clock.advance(RETRY_S)
    worker.tick()
    assert len(reports.completions) == 3
    assert (state.finished / "a-1").is_dir()


def test_completions_survive_a_worker_restart(
    state: StateDir, clock: ManualClock, processes: FakeProcesses, reports: FakeReports, worker: Worker
) -> None:
    accept(state, "a-1")
    worker.tick()
    finish(state, processes, "a-1")
    reports.complete_errors = [Unavailable("down")]
    worker.tick()
    fresh = Worker(
        state, clock, reports, FakeProcesses(), heartbeat_s=HEARTBEAT_S, completion_retry_s=RETRY_S
    )
    fresh.tick()  # a new worker knows nothing of the back-off: it reports at once
    assert [r.attempt_id for r in reports.completions] == ["a-1", "a-1"]
    assert (state.finished / "a-1").is_dir()


def test_a_refused_completion_is_kept_aside_not_retried(
    worker: Worker, state: StateDir, clock: ManualClock, processes: FakeProcesses, reports: FakeReports
) -> None:
    accept(state, "a-1")
    worker.tick()
    finish(state, processes, "a-1")
    reports.complete_errors = [ReportRefused("no such attempt")]
    worker.tick()
    clock.advance(HEARTBEAT_S * 10)
    worker.tick()
    assert len(reports.completions) == 1
    assert (state.refused / "a-1" / "refusal").read_text() == "no such attempt\n"


def test_a_runner_that_died_without_a_verdict_is_an_infra_error(
    worker: Worker, state: StateDir, processes: FakeProcesses, reports: FakeReports
) -> None:
    accept(state, "a-1")
    worker.tick()
    processes.live.clear()
    worker.tick()
    assert [(r.attempt_id, r.outcome) for r in reports.completions] == [("a-1", Outcome.INFRA_ERROR)]
    assert AttemptResult.load(state.finished / "a-1" / "result.json").outcome is Outcome.INFRA_ERROR


def test_a_restarted_worker_adopts_live_runners(
    state: StateDir, clock: ManualClock, processes: FakeProcesses, reports: FakeReports, worker: Worker
) -> None:
    accept(state, "a-1", slot=1)
    worker.tick()
    fresh = Worker(state, clock, reports, processes, heartbeat_s=HEARTBEAT_S, completion_retry_s=RETRY_S)
    fresh.tick()
    assert processes.spawned == ["a-1"]
    assert reports.heartbeats[-1][1] == [Running("a-1", 1)]
    assert reports.completions == []


def test_cancel_before_launch_never_starts_the_job(
    worker: Worker, state: StateDir, processes: FakeProcesses, reports: FakeReports
) -> None:
    accept(state, "a-1")
    state.cancel_request("a-1").write_text("user\n")
    worker.tick()
    assert processes.spawned == []
    assert [(r.attempt_id, r.outcome, r.slot_seconds) for r in reports.completions] == [
        ("a-1", Outcome.CANCELLED, 0.0)
    ]
    assert list(state.cancels.iterdir()) == []


def test_cancels_reach_the_runner_from_the_agent_and_the_heartbeat(
    worker: Worker, state: StateDir, clock: ManualClock, reports: FakeReports
) -> None:
    accept(state, "a-1")
    accept(state, "a-2", slot=1)
    worker.tick()
    state.cancel_request("a-1").write_text("user\n")
    reports.cancel_next = ["a-2", "never-heard-of"]
    clock.advance(HEARTBEAT_S)
    worker.tick()
    worker.tick()
    assert state.attempt("a-1").cancel.read_text() == "user\n"
    assert "no longer wants" in state.attempt("a-2").cancel.read_text()
    assert list(state.cancels.iterdir()) == []


def test_an_unreachable_scheduler_is_not_hammered_once_per_attempt(
    worker: Worker, state: StateDir, clock: ManualClock, processes: FakeProcesses, reports: FakeReports
) -> None:
    for index, attempt_id in enumerate(["a-1", "a-2", "a-3"]):
        accept(state, attempt_id, slot=index)
    worker.tick()
    for attempt_id in ["a-1", "a-2", "a-3"]:
        finish(state, processes, attempt_id)
    reports.complete_errors = [Unavailable("down")]
    worker.tick()
    assert len(reports.completions) == 1  # the first failure holds the others back
    clock.advance(RETRY_S)
    worker.tick()
    assert sorted(r.attempt_id for r in reports.completions[1:]) == ["a-1", "a-2", "a-3"]
    assert sorted(p.name for p in state.finished.iterdir()) == ["a-1", "a-2", "a-3"]


def test_an_unreadable_spec_is_set_aside(worker: Worker, state: StateDir, processes: FakeProcesses) -> None:
    state.inbox_spec("bad").write_text('{"attempt_id": "bad"}')
    accept(state, "good")
    worker.tick()
    worker.tick()
    assert processes.spawned == ["good"]
    assert (state.inbox / "bad.unreadable").exists()


def test_a_launched_attempt_starts_with_a_lease_counted_from_its_launch(
    worker: Worker, state: StateDir, clock: ManualClock, reports: FakeReports
) -> None:
    reports.heartbeat_error = Unavailable("scheduler down")  # nothing renews it yet
    launched_at = clock.now()
    accept(state, "a-1")
    worker.tick()
    assert read_renewal(state.attempt("a-1")) == Renewal(launched_at, 90.0)


def test_an_acknowledged_heartbeat_renews_the_leases_it_was_granted_from_when_it_asked(
    worker: Worker, state: StateDir, clock: ManualClock, reports: FakeReports
) -> None:
    reports.lease_s = 40.0
    accept(state, "a-1")
    accept(state, "a-2", slot=1)
    worker.tick()
    clock.advance(HEARTBEAT_S)
    asked_at = clock.now()
    reports.cancel_next = ["a-2"]  # the control plane ended a-2: not renewed
    worker.tick()
    assert read_renewal(state.attempt("a-1")) == Renewal(asked_at, 40.0)
    a2 = read_renewal(state.attempt("a-2"))
    assert a2 is not None and a2.at < asked_at


def test_an_undelivered_heartbeat_renews_nothing(
    worker: Worker, state: StateDir, clock: ManualClock, reports: FakeReports
) -> None:
    accept(state, "a-1")
    worker.tick()
    renewed = read_renewal(state.attempt("a-1"))
    reports.heartbeat_error = Unavailable("the path is cut")
    clock.advance(HEARTBEAT_S)
    worker.tick()
    assert read_renewal(state.attempt("a-1")) == renewed


def test_a_scheduler_that_states_no_lease_leaves_the_last_one_known(
    worker: Worker, state: StateDir, clock: ManualClock, reports: FakeReports
) -> None:
    reports.lease_s = 60.0
    worker.tick()
    reports.lease_s = 0.0
    accept(state, "a-1")
    clock.advance(HEARTBEAT_S)
    worker.tick()
    renewal = read_renewal(state.attempt("a-1"))
    assert renewal is not None and renewal.lease_s == 60.0
