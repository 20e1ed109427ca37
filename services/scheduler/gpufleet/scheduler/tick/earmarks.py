"""The films' writes: drains begun and earmarks released, in one fenced transaction.

What each write does to a machine is decided in :mod:`~gpufleet.scheduler.tick.earmark_updates`
(the simulator applies the same updates); this module reads the machines concerned, locked,
and writes each update as one compare-and-set on the state and earmark it read. The
earmark a start or create sets is written by the scale step with its intent; the one the
film ends by starting is cleared by the assign commit (:func:`clear_for_started_films`).
Nothing here calls a network.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.db.enums import MachineState
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.lifecycle import Actor, transition
from gpufleet.common.loops import TickReport
from gpufleet.scheduler.tick.earmark_updates import EarmarkRow, EarmarkUpdate, films_started, plan_updates
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
            ids = sorted({d.machine_id for d in drains} | {r.machine_id for r in releases})
            rows = {row.machine_id: row for row in _read(session, M.id.in_(ids))}
            for u in plan_updates(rows, drains, releases):
                if write(session, u, now):
                    report.actions[u.action] += 1
                    log.info(
                        "machine %s: %s",
                        u.read.machine_id,
                        u.why,
                        extra={
                            "fields": {
                                "machine_id": u.read.machine_id,
                                "job_id": u.earmark or u.read.earmarked_for,
                            }
                        },
                    )


def _read(session: Session, where: ColumnElement[bool]) -> list[EarmarkRow]:
    """The machines as the films' writes read them, locked until the commit."""
    found = session.execute(
        select(M.id, M.state, M.earmarked_for).where(where).order_by(M.id).with_for_update()
    ).all()
    return [EarmarkRow(mid, MachineState(state), job) for mid, state, job in found]


def write(session: Session, u: EarmarkUpdate, now: datetime) -> bool:
    """One update as a compare-and-set on the state and earmark it was decided from;
    False when the machine changed since."""
    read = u.read
    same = [
        M.earmarked_for.is_(None) if read.earmarked_for is None else M.earmarked_for == read.earmarked_for
    ]
    values: dict[str, Any] = {
        "earmarked_for": u.earmark,
        "earmarked_at": now if u.earmark is not None else None,
    }
    if u.to is not None:
        return transition(
            session,
            read.machine_id,
            read.state,
            u.to,
            by=Actor.FLEET_TICK,
            why=u.why,
            now=now,
            where=same,
            **values,
        )
    done = session.execute(
        update(M).where(M.id == read.machine_id, M.state == read.state.value, *same).values(**values)
    )
    return bool(getattr(done, "rowcount", 0) == 1)


def clear_for_started_films(session: Session, started: Iterable[tuple[str, str]], now: datetime) -> None:
    """Films just assigned (job id, machine id): every machine held for one of them is
    unearmarked, a draining one ready again (``earmark_updates.films_started``)."""
    on = dict(started)
    if not on:
        return
    for u in films_started(_read(session, M.earmarked_for.in_(list(on))), on):
        write(session, u, now)
