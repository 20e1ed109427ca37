"""Queue-wait timeout (every 60 s): a queued job past its kind's ``queue_wait_deadline_s``
fails, uncharged, with a message saying so (DESIGN §4).

A job waits for a GPU from its submission, or from the moment it went back to the queue
after an attempt. The deadline is the kind's: a film may wait longer than a clip. Failing
it charges nothing — a queued job holds no attempt — and the ledger says why
(``queue_wait_timeout``, routed to ``FAIL_JOB``). Each job failed is counted finished
(FAILED) once its transaction has committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.enums import JobState
from gpufleet.common.job_lifecycle import Mover
from gpufleet.common.job_outcomes import JobOutcomes, OutcomeTally
from gpufleet.common.job_writer import move_job
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.scheduler.watchdogs.common import MAX_PER_RUN, batches, queued_since, waiting_since

NAME = "queue_wait_timeout"


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    kind_id: str
    waiting_since: datetime
    deadline_s: float


@dataclass(frozen=True)
class Expire:
    job: QueuedJob
    waited_s: float

    @property
    def message(self) -> str:
        return (
            f"failed: waited {self.waited_s:.0f} s in the queue, past its kind's queue-wait "
            f"deadline ({self.job.deadline_s:g} s, kind {self.job.kind_id}); not charged"
        )


def decide(now: datetime, jobs: Sequence[QueuedJob]) -> list[Expire]:
    """The jobs that have waited longer than their deadline (strictly: a job exactly at its
    deadline still waits)."""
    expired = []
    for job in jobs:
        waited = (now - job.waiting_since).total_seconds()
        if waited > job.deadline_s:
            expired.append(Expire(job, waited))
    return expired


class QueueWaitTimeout:
    name = NAME

    def __init__(
        self, sessions: sessionmaker[Session], lease: LeaderLease, *, instruments: Instruments = PROCESS
    ) -> None:
        self.sessions = sessions
        self.lease = lease
        self.outcomes = JobOutcomes(instruments)

    def scan(self, now: datetime) -> list[QueuedJob]:
        """Every queued job with its kind's deadline, oldest wait first: one read of the
        queue (the fleet tick reads it every tick too); :func:`decide` compares."""
        since = queued_since()
        with self.sessions() as session:
            rows = session.execute(
                select(models.Job.id, models.Job.kind_id, since, models.JobKind.queue_wait_deadline_s)
                .join(models.JobKind, models.JobKind.id == models.Job.kind_id)
                .where(models.Job.state == JobState.QUEUED.value)
                .order_by(since)
            ).all()
        return [QueuedJob(r[0], r[1], r[2], float(r[3])) for r in rows]

    def run(self, now: datetime) -> TickReport:
        report = TickReport()
        expired = decide(now, self.scan(now))[:MAX_PER_RUN]
        for batch in batches(expired):
            tally = OutcomeTally()
            with self.sessions() as session, session.begin():
                self.lease.fence(session)
                for expire in batch:
                    if self._fail(session, now, expire, tally):
                        report.actions["failed"] += 1
                    else:
                        report.refusals["CHANGED_SINCE_SCAN"] += 1
            self.outcomes.committed(tally)
        return report

    @staticmethod
    def _fail(session: Session, now: datetime, expire: Expire, tally: OutcomeTally) -> bool:
        job = session.get(models.Job, expire.job.job_id, with_for_update=True)
        if job is None or job.state != JobState.QUEUED.value:
            return False  # dispatched, cancelled or ended since the scan
        if waiting_since(job) != expire.job.waiting_since:
            return False  # its wait began again since the scan
        move_job(session, job, JobState.FAILED, now, by=Mover.REQUEST_WATCHDOG, message=expire.message)
        tally.job_moved(job.kind_id, JobState.QUEUED.value, job.state)
        record_failure(
            session, now, FailureClass.QUEUE_WAIT_TIMEOUT.value, NAME, job_id=job.id, details=expire.message
        )
        return True
