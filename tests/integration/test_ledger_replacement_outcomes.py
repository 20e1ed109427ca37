"""A machine the ledger replaces (``REPLACE_MACHINE``: a reaper net's went_silent, boot_failed
or provision_timeout, the sweeper's preempted or instance_gone) as an operator counts it, on
a real PostgreSQL: each live attempt ended is one ``gpufleet.attempts.lost``, each job sent
back to the queue one ``gpufleet.jobs.retried`` under the row's class, each job the loss
ended for good one ``gpufleet.jobs.finished`` — once the writer's transaction commits, once
however often the net comes back to the same machine, and never for a rollback."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import Attempt, Job, JobKind, Plan, Pool, Workspace
from gpufleet.common.ledger import apply_outcome, record_and_apply, record_failure
from gpufleet.common.metrics.catalog import ATTEMPTS_LOST, JOBS_FINISHED, JOBS_RETRIED, LEDGER_FAILURES
from tests.support.fleet_rows import add_machine, job_row
from tests.support.metrics import MetricsProbe

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


class Boom(Exception):
    pass


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        s.add_all(
            [
                Plan(id="p"),
                Pool(id="pool", gpu_model="L4", slots_per_machine=2),
                JobKind(id="clip", time_limit_s=3600.0, lost_retry_budget=2),
                JobKind(id="film", time_limit_s=9 * 3600.0, lost_retry_budget=2),
            ]
        )
        s.flush()
        s.add(Workspace(id="w", plan_id="p"))
    yield sessions
    engine.dispose()


@pytest.fixture
def probe() -> Iterator[MetricsProbe]:
    p = MetricsProbe()
    yield p
    p.close()


def running(sessions: sessionmaker[Session], machine_id: str, slot: int, kind: str, **job: object) -> str:
    """A job of ``kind`` running on ``slot`` of ``machine_id``; its attempt's id."""
    with sessions() as s, s.begin():
        row = job_row(T0, workspace_id="w", pool_id="pool", kind_id=kind, state="RUNNING", **job)
        s.add(row)
        s.flush()
        attempt = Attempt(
            id=f"{row.id}-a1",
            job_id=row.id,
            machine_id=machine_id,
            slot=slot,
            state="RUNNING",
            started_at=T0 - timedelta(minutes=10),
            lease_expires_at=T0 + timedelta(minutes=5),
        )
        s.add(attempt)
    return attempt.id


def counted(
    probe: MetricsProbe,
) -> tuple[dict[str, float], dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """(lost by kind, retried by (kind, class), finished by (kind, outcome))."""
    lost = {dict(k)["kind"]: v for k, v in probe.series(ATTEMPTS_LOST.name).items()}
    retried = {
        (dict(k)["kind"], dict(k)["failure_class"]): v for k, v in probe.series(JOBS_RETRIED.name).items()
    }
    finished = {(dict(k)["kind"], dict(k)["outcome"]): v for k, v in probe.series(JOBS_FINISHED.name).items()}
    return lost, retried, finished


def states(sessions: sessionmaker[Session], ids: list[str]) -> list[str]:
    with sessions() as s:
        return [s.get_one(Attempt, i).state for i in ids]


def test_two_live_attempts_are_lost_and_their_jobs_retried_under_the_class_counted_once(
    sessions: sessionmaker[Session], probe: MetricsProbe
) -> None:
    machine = add_machine(sessions, T0, state="DESTROYING")
    attempts = [running(sessions, machine, 0, "clip"), running(sessions, machine, 1, "film")]

    with sessions() as s, s.begin():
        _, applied = record_and_apply(
            s, T0, "went_silent", "went_silent", machine_id=machine, instruments=probe.instruments
        )
        assert [a.job_state for a in applied.lost_attempts] == ["QUEUED", "QUEUED"]
        assert counted(probe) == ({}, {}, {})  # written, not yet committed
    assert counted(probe) == (
        {"clip": 1, "film": 1},
        {("clip", "went_silent"): 1, ("film", "went_silent"): 1},
        {},
    )

    # The net comes back to the same machine (its next pass, or another net): nothing is
    # live there any more, so nothing more is lost or retried — the row is written again.
    with sessions() as s, s.begin():
        record_failure(
            s,
            T0 + timedelta(seconds=30),
            "went_silent",
            "went_silent",
            machine_id=machine,
            apply=True,
            instruments=probe.instruments,
        )
    assert sum(probe.series(ATTEMPTS_LOST.name).values()) == 2
    assert sum(probe.series(JOBS_RETRIED.name).values()) == 2
    assert probe.value(LEDGER_FAILURES.name, failure_class="went_silent", outcome="REPLACE_MACHINE") == 2
    assert states(sessions, attempts) == ["LOST", "LOST"]


def test_a_loss_that_ends_a_job_counts_it_finished_and_its_attempt_lost(
    sessions: sessionmaker[Session], probe: MetricsProbe
) -> None:
    machine = add_machine(sessions, T0, state="STOPPED")
    # One job has spent its lost-retry budget (2), one was asked to cancel.
    running(sessions, machine, 0, "clip", lost_retries_used=2)
    running(sessions, machine, 1, "clip", cancel_requested=True)

    with sessions() as s, s.begin():
        record_and_apply(
            s, T0, "went_silent", "went_silent", machine_id=machine, instruments=probe.instruments
        )
    assert counted(probe) == (
        {"clip": 2},
        {},
        {("clip", "FAILED"): 1, ("clip", "CANCELLED"): 1},
    )
    with sessions() as s:
        assert sorted(s.execute(select(Job.state)).scalars()) == ["CANCELLED", "FAILED"]


def test_a_replacement_rolled_back_counts_nothing(
    sessions: sessionmaker[Session], probe: MetricsProbe
) -> None:
    machine = add_machine(sessions, T0, state="DESTROYING")
    attempts = [running(sessions, machine, 0, "clip"), running(sessions, machine, 1, "clip")]

    # The pass failed after the replacement was written (e.g. fenced): rolled back.
    with pytest.raises(Boom), sessions() as s, s.begin():
        record_and_apply(
            s, T0, "boot_failed", "boot_failure", machine_id=machine, instruments=probe.instruments
        )
        raise Boom
    # A savepoint around the replacement rolls back; the transaction around it commits.
    with sessions() as s, s.begin():
        nested = s.begin_nested()
        record_and_apply(
            s, T0, "boot_failed", "boot_failure", machine_id=machine, instruments=probe.instruments
        )
        nested.rollback()
    # Applied to a row written before, in a session closed without committing.
    with sessions() as s:
        row = record_failure(s, T0, "instance_gone", "inventory_reconcile", machine_id=machine)
        apply_outcome(s, T0, row, instruments=probe.instruments)
    assert counted(probe) == ({}, {}, {})
    assert states(sessions, attempts) == ["RUNNING", "RUNNING"]

    # The same outcome applied and committed: counted, under the class of its row.
    with sessions() as s, s.begin():
        row = record_failure(s, T0, "instance_gone", "inventory_reconcile", machine_id=machine)
        apply_outcome(s, T0, row, instruments=probe.instruments)
    assert counted(probe) == ({"clip": 2}, {("clip", "instance_gone"): 2}, {})


def test_a_gpu_fault_replacement_retries_the_jobs_and_counts_no_attempt_lost(
    sessions: sessionmaker[Session], probe: MetricsProbe
) -> None:
    """The job lifecycle ends a GPU fault's attempts INFRA_ERROR (ours, uncharged, retried
    patiently), not LOST: the jobs are retried under the class, no attempt is counted lost."""
    machine = add_machine(sessions, T0)
    attempt = running(sessions, machine, 0, "clip")
    with sessions() as s, s.begin():
        record_and_apply(s, T0, "gpu_fault", "scheduler", machine_id=machine, instruments=probe.instruments)
    assert states(sessions, [attempt]) == ["INFRA_ERROR"]
    assert counted(probe) == ({}, {("clip", "gpu_fault"): 1}, {})
