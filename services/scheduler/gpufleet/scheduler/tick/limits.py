"""Leases and time limits: the tick's database-only step that runs every tick, whatever
provider calls or dispatches are pending (they run in the call pool, never here)."""

from __future__ import annotations

import logging
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.enums import LIVE_ATTEMPT_STATES
from gpufleet.common.job_lifecycle import EndCause, Mover, lease_expiry_cause
from gpufleet.common.job_outcomes import JobOutcomes, OutcomeTally
from gpufleet.common.job_writer import end_attempt
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.dispatch import DispatchController

log = logging.getLogger(__name__)

# Attempts ended a tick, per kind, and to a transaction.
PER_TICK = 1000
BATCH = 200

# What each limit ends an attempt with and the ledger's class for it, for this step's writes
# and the simulator's alike: a lease that ran out ends it as ``lease_expiry_cause`` says
# (lost, or disrupted when its agent still answered) under LEASE_EXPIRED; a time limit
# passed ends it TIME_LIMIT under JOB_TIMED_OUT.
LEASE_LEDGER_CLASS = FailureClass.LEASE_EXPIRED
TIME_LIMIT_END = EndCause.TIME_LIMIT
TIME_LIMIT_LEDGER_CLASS = FailureClass.JOB_TIMED_OUT


class LimitsController:
    """Ends attempts whose lease ran out (LOST, requeued) or that ran past their kind's
    limit (TIMED_OUT), each in its own fenced transaction; the agent is told to cancel
    from the call pool."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        settings: Settings,
        dispatch: DispatchController,
        outcomes: JobOutcomes,
    ) -> None:
        self.sessions = sessions
        self.lease = lease
        self.settings = settings
        self.dispatch = dispatch
        self.outcomes = outcomes
        self.retry_policy = settings.retry_policy()

    def apply(self, expired: list[str], over_limit: list[str], now: datetime, report: TickReport) -> None:
        """At most ``PER_TICK`` of each a tick, ``BATCH`` to a transaction, so that a mass
        expiry (a partition, a long outage of the workers' path) never makes a long pass;
        the rest are taken by the next ticks."""
        for ids, end, what in (
            (expired, self._expire_lease, "lease_expired"),
            (over_limit, self._time_out, "timed_out"),
        ):
            now_ids, later = ids[:PER_TICK], ids[PER_TICK:]
            if later:
                report.refusals[f"{what}_next_tick"] += len(later)
            for i in range(0, len(now_ids), BATCH):
                cancels: list[tuple[str, str, str]] = []
                tally = OutcomeTally()
                with self.sessions() as session, session.begin():
                    self.lease.fence(session)
                    for attempt_id in now_ids[i : i + BATCH]:
                        ended = end(session, attempt_id, now, tally)
                        if ended is not None:
                            report.actions[what] += 1
                            machine_id, address = ended
                            if address:
                                cancels.append((machine_id, address, attempt_id))
                self.outcomes.committed(tally)
                for machine_id, address, attempt_id in cancels:
                    # The job runs again elsewhere, or is over: the first process must not
                    # keep running on an agent that is still reachable.
                    self.dispatch.cancel(machine_id, address, attempt_id, what.replace("_", " "))

    def _expire_lease(
        self, session: Session, attempt_id: str, now: datetime, tally: OutcomeTally
    ) -> tuple[str, str] | None:
        """End one attempt LOST (our failure: uncharged, requeued patiently); its
        machine's id and agent address ("" if none), or None when it was not due after all."""
        attempt = session.get(models.Attempt, attempt_id, with_for_update=True)
        if attempt is None or attempt.state not in LIVE_ATTEMPT_STATES or attempt.lease_expires_at >= now:
            return None
        machine = session.get_one(models.Machine, attempt.machine_id)
        lease_ran_out = attempt.lease_expires_at
        # Its agent still answering long after the worker went quiet: not the job's doing.
        cause = lease_expiry_cause(
            lease_ran_out, self.settings.attempt_lease_s, machine.probe_ok_at, self.settings.worker_fresh_s
        )
        ended = end_attempt(
            session,
            attempt,
            cause,
            now,
            by=Mover.LEASE_EXPIRY,
            policy=self.retry_policy,
            message=(
                "lease expired: the machine stopped reporting"
                if cause is EndCause.LEASE_EXPIRED
                else "lease expired: the machine's worker stopped reporting while its agent still answered"
            ),
            tally=tally,
        )
        record_failure(
            session,
            now,
            LEASE_LEDGER_CLASS,
            "fleet_tick",
            machine_id=attempt.machine_id,
            job_id=ended.job.id,
            attempt_id=attempt.id,
            details=f"lease ran out at {lease_ran_out.isoformat()}",
        )
        log.warning(
            "attempt %s lost: lease expired", attempt_id, extra={"fields": {"attempt_id": attempt_id}}
        )
        return machine.id, machine.agent_address or ""

    def _time_out(
        self, session: Session, attempt_id: str, now: datetime, tally: OutcomeTally
    ) -> tuple[str, str] | None:
        attempt = session.get(models.Attempt, attempt_id, with_for_update=True)
        if attempt is None or attempt.state not in LIVE_ATTEMPT_STATES:
            return None
        machine = session.get_one(models.Machine, attempt.machine_id)
        ended = end_attempt(
            session,
            attempt,
            TIME_LIMIT_END,
            now,
            by=Mover.LIMITS,
            policy=self.retry_policy,
            message="past its kind's time limit",
            tally=tally,
        )
        record_failure(
            session,
            now,
            TIME_LIMIT_LEDGER_CLASS,
            "fleet_tick",
            machine_id=machine.id,
            job_id=ended.job.id,
            attempt_id=attempt.id,
            details="past its kind's time limit",
        )
        return machine.id, machine.agent_address or ""
