"""Stuck-dispatch reset (every 60 s): a job left in DISPATCHING with nothing dispatching
it goes back to the queue, dispatchable at once, without spending its retry budget
(DESIGN §4).

A job is DISPATCHING while an attempt of its is STARTING; the fleet tick's dispatch
deadline owns that case (it takes the attempt back after 30 s). This net is the narrow
backstop for the other one: a job still DISPATCHING past the bound with no live attempt
at all — a state only a fault can leave (a restore, a hand edit, a bug) and which nothing
else would ever move. The job did not fail and was not lost, so neither budget is spent
and any back-off is cleared. A job whose attempt is still live is refused
(``ATTEMPT_IN_FLIGHT``): the dispatch deadline decides it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.enums import LIVE_ATTEMPT_STATES, JobState
from gpufleet.common.job_lifecycle import Mover
from gpufleet.common.job_writer import move_job
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.scheduler.watchdogs.common import MAX_PER_RUN, batches

NAME = "stuck_dispatch_reset"
_LIVE = [s.value for s in LIVE_ATTEMPT_STATES]


@dataclass(frozen=True)
class DispatchingJob:
    job_id: str
    dispatching_since: datetime
    live_attempts: int


@dataclass(frozen=True)
class StuckDispatchPolicy:
    after: timedelta = timedelta(minutes=5)


@dataclass
class StuckDispatchDecision:
    reset: list[DispatchingJob]
    refusals: Counter[str] = field(default_factory=Counter)


def decide(
    now: datetime, jobs: Sequence[DispatchingJob], policy: StuckDispatchPolicy
) -> StuckDispatchDecision:
    decision = StuckDispatchDecision([])

    for job in jobs:
        if job.live_attempts:
            decision.refusals["ATTEMPT_IN_FLIGHT"] += 1
        elif now - job.dispatching_since <= policy.after:
            decision.refusals["INSIDE_BOUND"] += 1
        else:
            decision.reset.append(job)
    return decision


class StuckDispatchReset:
    name = NAME

    def __init__(
        self, sessions: sessionmaker[Session], lease: LeaderLease, policy: StuckDispatchPolicy
    ) -> None:
        self.sessions = sessions
        self.lease = lease
        self.policy = policy

    def scan(self) -> list[DispatchingJob]:
        live = (
            select(models.Attempt.id)
            .where(models.Attempt.job_id == models.Job.id, models.Attempt.state.in_(_LIVE))
            .exists()
        )
        with self.sessions() as session:
            rows = session.execute(
                select(models.Job.id, models.Job.updated_at, live).where(
                    models.Job.state == JobState.DISPATCHING.value
                )
            ).all()
        return [DispatchingJob(r[0], r[1], 1 if r[2] else 0) for r in rows]

    def run(self, now: datetime) -> TickReport:
        report = TickReport()
        decision = decide(now, self.scan(), self.policy)
        report.refusals.update(decision.refusals)
        for batch in batches(decision.reset[:MAX_PER_RUN]):
            with self.sessions() as session, session.begin():
                self.lease.fence(session)
                for job in batch:
                    if self._reset(session, now, job):
                        report.actions["reset"] += 1
                    else:
                        report.refusals["CHANGED_SINCE_SCAN"] += 1
        return report

    def _reset(self, session: Session, now: datetime, stuck: DispatchingJob) -> bool:
        job = session.get(models.Job, stuck.job_id, with_for_update=True)
        if (
            job is None
            or job.state != JobState.DISPATCHING.value
            or job.updated_at != stuck.dispatching_since
        ):
            return False
        live = session.execute(
            select(models.Attempt.id).where(models.Attempt.job_id == job.id, models.Attempt.state.in_(_LIVE))
        ).first()
        if live is not None:
            return False
        waited = (now - stuck.dispatching_since).total_seconds()
        message = (
            f"back in the queue: dispatching for {waited:.0f} s with no attempt starting; no retry spent"
        )
        job.not_before = None
        move_job(session, job, JobState.QUEUED, now, by=Mover.REQUEST_WATCHDOG, message=message)
        record_failure(session, now, FailureClass.DISPATCH_STUCK.value, NAME, job_id=job.id, details=message)
        return True
