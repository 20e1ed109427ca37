"""The pools' writes: the idle clock moved and the warm pins set or cleared, in one
fenced transaction (see :mod:`~gpufleet.scheduler.tick.warm` for the rules). Nothing
here calls a network, and only the pools whose clock moves and the machines whose pin
changes are written."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import TickReport
from gpufleet.scheduler.tick.model import PoolClock, WarmPin
from gpufleet.scheduler.tick.warm import clock_values


class PoolController:
    def __init__(self, sessions: sessionmaker[Session], lease: LeaderLease) -> None:
        self.sessions = sessions
        self.lease = lease

    def apply(self, clocks: list[PoolClock], pins: list[WarmPin], now: datetime, report: TickReport) -> None:
        if not clocks and not pins:
            return
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            for clock in clocks:
                values = clock_values(clock, now)
                session.execute(update(models.Pool).where(models.Pool.id == clock.pool_id).values(**values))
                report.actions["pool_busy" if clock.busy else "pool_idle"] += 1
            for held in (True, False):
                ids = [p.machine_id for p in pins if p.held is held]
                if ids:
                    session.execute(
                        update(models.Machine).where(models.Machine.id.in_(ids)).values(warm_held=held)
                    )
                    report.actions["warm_pinned" if held else "warm_unpinned"] += len(ids)
