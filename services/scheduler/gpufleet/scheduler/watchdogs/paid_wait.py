"""Paid-wait incident (every 60 s): a job of a paid plan that has waited more than 30 min
for a GPU opens one incident — once per job, ever — and the incident is resolved when the
job leaves the queue (DESIGN §4).

A paid plan is one whose rate is above zero. The job's ``paid_wait_incident`` flag and the
incident's dedupe key (``paid_wait:<job>``) both make it once per job: a job that waits
again after a lost attempt does not page twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.enums import IncidentState, JobState
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.scheduler.watchdogs.common import MAX_PER_RUN, batches, queued_since

NAME = "paid_wait_incident"


@dataclass(frozen=True)
class WaitingJob:
    job_id: str
    workspace_id: str
    plan_id: str
    rate_micros: int
    waiting_since: datetime
    already_opened: bool


@dataclass(frozen=True)
class PaidWaitPolicy:
    after: timedelta = timedelta(minutes=30)


@dataclass
class PaidWaitDecision:
    open: list[WaitingJob]
    refusals: Counter[str] = field(default_factory=Counter)


def decide(now: datetime, jobs: Sequence[WaitingJob], policy: PaidWaitPolicy) -> PaidWaitDecision:
    """Which waiting jobs open an incident; the rest counted by the gate that refused them."""
    decision = PaidWaitDecision([])

    for job in jobs:
        if job.rate_micros <= 0:
            decision.refusals["FREE_PLAN"] += 1
        elif job.already_opened:
            decision.refusals["ALREADY_OPENED"] += 1
        elif now - job.waiting_since <= policy.after:
            decision.refusals["NOT_WAITING_LONG_ENOUGH"] += 1
        else:
            decision.open.append(job)
    return decision


def incident_key(job_id: str) -> str:
    return f"{FailureClass.PAID_WAIT.value}:{job_id}"


class PaidWaitIncident:
    name = NAME

    def __init__(self, sessions: sessionmaker[Session], lease: LeaderLease, policy: PaidWaitPolicy) -> None:
        self.sessions = sessions
        self.lease = lease
        self.policy = policy

    def scan(self) -> list[WaitingJob]:
        since = queued_since()
        with self.sessions() as session:
            rows = session.execute(
                select(
                    models.Job.id,
                    models.Job.workspace_id,
                    models.Plan.id,
                    models.Plan.rate_micros,
                    since,
                    models.Job.paid_wait_incident,
                )
                .join(models.Workspace, models.Workspace.id == models.Job.workspace_id)
                .join(models.Plan, models.Plan.id == models.Workspace.plan_id)
                .where(models.Job.state == JobState.QUEUED.value)
            ).all()
        return [WaitingJob(r[0], r[1], r[2], int(r[3]), r[4], bool(r[5])) for r in rows]

    def run(self, now: datetime) -> TickReport:
        report = TickReport()
        decision = decide(now, self.scan(), self.policy)
        report.refusals.update(decision.refusals)
        for batch in batches(decision.open[:MAX_PER_RUN]):
            with self.sessions() as session, session.begin():
                self.lease.fence(session)
                for job in batch:
                    if self._open(session, now, job):
                        report.actions["opened"] += 1
                    else:
                        report.refusals["CHANGED_SINCE_SCAN"] += 1
        report.actions["resolved"] += self._resolve_started(now)
        return report

    def _open(self, session: Session, now: datetime, job: WaitingJob) -> bool:
        claimed = session.execute(
            update(models.Job)
            .where(
                models.Job.id == job.job_id,
                models.Job.state == JobState.QUEUED.value,
                models.Job.paid_wait_incident.is_(False),
            )
            .values(paid_wait_incident=True)
            .execution_options(synchronize_session=False)
        )
        if getattr(claimed, "rowcount", 0) != 1:
            return False
        waited = (now - job.waiting_since).total_seconds()
        record_failure(
            session,
            now,
            FailureClass.PAID_WAIT.value,
            NAME,
            job_id=job.job_id,
            details=(
                f"job {job.job_id} of workspace {job.workspace_id} (plan {job.plan_id}, paid) has waited "
                f"{waited / 60:.0f} min for a GPU, over {self.policy.after.total_seconds() / 60:g} min"
            ),
            incident_key=incident_key(job.job_id),
        )
        return True

    def _resolve_started(self, now: datetime) -> int:
        """Resolve the open paid-wait incidents whose job is no longer waiting."""
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            result = session.execute(
                update(models.Incident)
                .where(
                    models.Incident.failure_class == FailureClass.PAID_WAIT.value,
                    models.Incident.state != IncidentState.RESOLVED.value,
                    models.Incident.job_id.in_(
                        select(models.Job.id).where(models.Job.state != JobState.QUEUED.value)
                    ),
                )
                .values(state=IncidentState.RESOLVED.value, resolved_at=now)
                .execution_options(synchronize_session=False)
            )
            return int(getattr(result, "rowcount", 0) or 0)
