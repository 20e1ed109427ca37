"""The films' writes: drains begun and earmarks released, in one fenced transaction.

A drain moves a ready machine to ``DRAINING`` (through the lifecycle's compare-and-set,
only while it is still ready and unearmarked) and earmarks it for its film; a release
clears the earmark (only while it still names that film) and moves a draining machine
back to ``READY``. The earmark a start or create sets is written by the scale step with
its intent; the one the film ends by starting is cleared by the assign commit
(:func:`clear_for_started_films`). Nothing here calls a network.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.enums import MachineState
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.lifecycle import Actor, transition
from gpufleet.common.loops import TickReport
from gpufleet.scheduler.tick.model import Drain, Release

log = logging.getLogger(__name__)

M = models.Machine


class EarmarkController:
    def __init__(self, sessions: sessionmaker[Session], lease: LeaderLease) -> None:
        self.sessions = sessions
        self.lease = lease

    def apply(self, drains: list[Drain], releases: list[Release], now: datetime, report: TickReport) -> None:
        if not drains and not releases:
            return
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            for r in releases:
                if release(session, r.machine_id, r.job_id, r.why, now):
                    report.actions["earmark_released"] += 1
                    log.info(
                        "machine %s no longer held for film %s: %s",
                        r.machine_id,
                        r.job_id,
                        r.why,
                        extra={"fields": {"machine_id": r.machine_id, "job_id": r.job_id}},
                    )
            for d in drains:
                why = f"draining for film {d.job_id}: its jobs end soonest (by {d.ends_at:%H:%M:%S} UTC)"
                if transition(
                    session,
                    d.machine_id,
                    MachineState.READY,
                    MachineState.DRAINING,
                    by=Actor.FLEET_TICK,
                    why=why,
                    now=now,
                    where=[M.earmarked_for.is_(None)],
                    earmarked_for=d.job_id,
                    earmarked_at=now,
                ):
                    report.actions["drain"] += 1
                    log.info(
                        "machine %s drains for film %s",
                        d.machine_id,
                        d.job_id,
                        extra={"fields": {"machine_id": d.machine_id, "job_id": d.job_id}},
                    )


def release(session: Session, machine_id: str, job_id: str, why: str, now: datetime) -> bool:
    """Clear ``machine_id``'s earmark for ``job_id``; a draining machine is ready again.
    False when the earmark no longer names that film."""
    state = session.execute(
        select(M.state).where(M.id == machine_id, M.earmarked_for == job_id).with_for_update()
    ).scalar_one_or_none()
    if state is None:
        return False
    if state == MachineState.DRAINING.value:
        transition(
            session,
            machine_id,
            MachineState.DRAINING,
            MachineState.READY,
            by=Actor.FLEET_TICK,
            why=f"no longer drained for film {job_id}: {why}",
            now=now,
        )
    session.execute(update(M).where(M.id == machine_id).values(earmarked_for=None, earmarked_at=None))
    return True


def clear_for_started_films(session: Session, started: Iterable[tuple[str, str]], now: datetime) -> None:
    """Films just assigned (job id, machine id): the machine a film starts on is ready and
    unearmarked again (a DRAINING one has done its draining), and any other machine held
    for the same film is released at once."""
    started = list(started)
    if not started:
        return
    on = dict(started)
    rows = session.execute(
        select(M.id, M.earmarked_for, M.state).where(M.earmarked_for.in_(list(on))).with_for_update()
    ).all()
    for machine_id, job_id, state in rows:
        where = on[str(job_id)]
        why = f"film {job_id} started {'here' if where == machine_id else f'on machine {where}'}"
        if state == MachineState.DRAINING.value:
            transition(
                session,
                machine_id,
                MachineState.DRAINING,
                MachineState.READY,
                by=Actor.FLEET_TICK,
                why=why,
                now=now,
            )
    session.execute(
        update(M).where(M.earmarked_for.in_(list(on))).values(earmarked_for=None, earmarked_at=None)
    )
