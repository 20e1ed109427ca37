"""No-consumer detector (every 60 s): a queued job whose pool nothing can ever serve fails,
with a message naming why, rather than waiting forever (DESIGN §4).

A pool can be served when it has a machine (running or stopped, provisioned or
registered), or when one of its offerings is usable: its provider is one the provisioner
runs, its provider/region is not halted, and both ceilings (the pool's and the fleet's)
allow a machine. An offering quarantined for a stockout is usable later — it waits out its
TTL — so it counts as a consumer. The detector refreshes, each run and outside any
transaction, which offerings the provisioner serves (``ListOfferings``); the fleet tick
reads the same set and never creates from an offering no driver serves. Until the set
has been read once, it refuses (``PROVIDERS_UNKNOWN``): a provisioner that is down is not
evidence that nothing can serve. Each job failed is counted finished (FAILED) once its
transaction has committed.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.enums import JobState, MachineState
from gpufleet.common.errors import GpufleetError
from gpufleet.common.job_lifecycle import Mover
from gpufleet.common.job_outcomes import JobOutcomes, OutcomeTally
from gpufleet.common.job_writer import move_job
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.scheduler.tick.served import ServedOfferings
from gpufleet.scheduler.tick.snapshot import active_quarantines
from gpufleet.scheduler.watchdogs.common import MAX_PER_RUN, batches

NAME = "no_consumer"
Halted = frozenset[tuple[str, str]]
log = logging.getLogger(__name__)


class OfferingLister(Protocol):
    def served_offering_ids(self) -> set[str]: ...


@dataclass(frozen=True)
class OfferingSupply:
    offering_id: str
    provider: str
    region: str


@dataclass(frozen=True)
class PoolSupply:
    pool_id: str
    max_machines: int
    machines: int  # not destroyed: running, stopped, on their way, or registered
    offerings: tuple[OfferingSupply, ...]


@dataclass
class NoConsumerDecision:
    # job id -> why nothing can serve it
    fail: dict[str, str] = field(default_factory=dict)
    refusals: Counter[str] = field(default_factory=Counter)


def why_unserved(
    pool: PoolSupply | None,
    served: frozenset[str],
    halted: frozenset[tuple[str, str]],
    max_running_machines: int,
) -> str | None:
    """Why nothing can ever serve ``pool``, or None when something can."""
    if pool is None:
        return "the pool is not in the catalogue"
    if pool.machines:
        return None
    reasons = []
    if pool.max_machines <= 0:
        reasons.append(f"pool {pool.pool_id}'s ceiling is 0 and it has no machine")
    if max_running_machines <= 0:
        reasons.append("the fleet's ceiling (GPUFLEET_MAX_RUNNING_MACHINES) is 0")
    usable = False
    for o in pool.offerings:
        if o.offering_id not in served:
            reasons.append(
                f"offering {o.offering_id} is on provider {o.provider}, which the provisioner does not run"
            )
        elif (o.provider, o.region) in halted:
            reasons.append(f"offering {o.offering_id}'s {o.provider} {o.region} is halted")
        else:
            usable = True
    if not pool.offerings:
        reasons.append(f"pool {pool.pool_id} has no offering")
    if usable and pool.max_machines > 0 and max_running_machines > 0:
        return None
    return "; ".join(reasons)


def decide(
    queued: Mapping[str, Sequence[str]],
    pools: Mapping[str, PoolSupply],
    served: frozenset[str] | None,
    halted: frozenset[tuple[str, str]],
    max_running_machines: int,
) -> NoConsumerDecision:
    """``queued``: pool id -> its queued job ids. Every job of a pool nothing can serve fails."""
    decision = NoConsumerDecision()

    for pool_id, jobs in queued.items():
        if served is None:
            decision.refusals["PROVIDERS_UNKNOWN"] += len(jobs)
            continue
        pool = pools.get(pool_id)
        why = why_unserved(pool, served, halted, max_running_machines)
        if why is None:
            decision.refusals[
                "HAS_MACHINE" if pool is not None and pool.machines else "HAS_USABLE_OFFERING"
            ] += len(jobs)
            continue
        for job_id in jobs:
            decision.fail[job_id] = why
    return decision


class NoConsumerDetector:
    name = NAME

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        provisioner: OfferingLister,
        served: ServedOfferings,
        max_running_machines: int,
        *,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.lease = lease
        self.provisioner = provisioner
        self.served = served
        self.max_running_machines = max_running_machines
        self.outcomes = JobOutcomes(instruments)

    def refresh(self, report: TickReport) -> None:
        """Read what the provisioner serves (a network call: no transaction is open)."""
        try:
            self.served.set(self.provisioner.served_offering_ids())
        except GpufleetError as exc:
            report.refusals["PROVISIONER_UNREACHABLE"] += 1
            log.warning("could not read the provisioner's offerings (keeping the last read): %s", exc)

    def scan(
        self, now: datetime
    ) -> tuple[dict[str, list[str]], dict[str, PoolSupply], frozenset[tuple[str, str]]]:
        with self.sessions() as session:
            queued: dict[str, list[str]] = defaultdict(list)
            for job_id, pool_id in session.execute(
                select(models.Job.id, models.Job.pool_id).where(models.Job.state == JobState.QUEUED.value)
            ):
                queued[pool_id].append(job_id)
            if not queued:
                return {}, {}, frozenset()
            machines = dict(
                session.execute(
                    select(models.Machine.pool_id, func.count())
                    .where(models.Machine.state != MachineState.DESTROYED.value)
                    .group_by(models.Machine.pool_id)
                ).all()
            )
            offerings: dict[str, list[OfferingSupply]] = defaultdict(list)
            for o in session.execute(select(models.Offering).order_by(models.Offering.rank)).scalars():
                offerings[o.pool_id].append(OfferingSupply(o.id, o.provider, o.region))
            pools = {
                p.id: PoolSupply(p.id, p.max_machines, int(machines.get(p.id, 0)), tuple(offerings[p.id]))
                for p in session.execute(select(models.Pool)).scalars()
            }
            _, halted = active_quarantines(session, now)
        return dict(queued), pools, halted

    def run(self, now: datetime) -> TickReport:
        report = TickReport()
        self.refresh(report)
        queued, pools, halted = self.scan(now)
        decision = decide(queued, pools, self.served.get(), halted, self.max_running_machines)
        report.refusals.update(decision.refusals)
        failing = list(decision.fail.items())[:MAX_PER_RUN]
        for batch in batches(failing):
            tally = OutcomeTally()
            with self.sessions() as session, session.begin():
                self.lease.fence(session)
                for job_id, why in batch:
                    if self._fail(session, now, job_id, why, tally):
                        report.actions["failed"] += 1
                    else:
                        report.refusals["CHANGED_SINCE_SCAN"] += 1
            self.outcomes.committed(tally)
        return report

    @staticmethod
    def _fail(session: Session, now: datetime, job_id: str, why: str, tally: OutcomeTally) -> bool:
        job = session.get(models.Job, job_id, with_for_update=True)
        if job is None or job.state != JobState.QUEUED.value:
            return False
        message = f"failed: nothing can serve pool {job.pool_id} ({why}); not charged"
        move_job(session, job, JobState.FAILED, now, by=Mover.REQUEST_WATCHDOG, message=message)
        tally.job_moved(job.kind_id, JobState.QUEUED.value, job.state)
        record_failure(session, now, FailureClass.NO_CONSUMER.value, NAME, job_id=job.id, details=message)
        return True
