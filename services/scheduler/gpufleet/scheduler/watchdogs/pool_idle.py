"""Pool idle release (every 15 min): a pool idle for its own idle time releases its warm
capacity — the machines the pool keeps running for its warm target are handed back to the
money chain, which stops them as it would any quiet machine. It never touches a machine
(seed 000: "releases the pool; never touches a machine"): it clears the pool's pins and
marks the pool released, in one fenced compare-and-set on the idle clock it read.

The idle clock itself is the fleet tick's (``idle_since``, started when the pool has
neither queued work nor a live attempt, stopped when work comes back, which also holds
the warm capacity again): see :mod:`gpufleet.scheduler.tick.warm`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db import models
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.loops import TickReport

NAME = "pool_idle_release"


@dataclass(frozen=True)
class PoolIdle:
    pool_id: str
    warm_target: int
    idle_since: datetime | None
    idle_release_after_s: float
    warm_released: bool


@dataclass
class PoolIdleDecision:
    release: list[PoolIdle]
    refusals: Counter[str] = field(default_factory=Counter)


# A release's writes, applied by the watchdog's SQL and by the simulator alike (issue 26):
# the pool's row, every machine it pinned, and the ledger's class for it.
RELEASED: dict[str, bool] = {"warm_released": True}
UNPINNED: dict[str, bool] = {"warm_held": False}
DETECTS = FailureClass.POOL_IDLE_RELEASE


def due_at(pool: PoolIdle) -> datetime | None:
    """When the pool is first released if nothing changes (its requeue-after): its idle
    time after its idle clock started; None while it has work, no warm capacity to release
    or has released it."""
    if pool.warm_target <= 0 or pool.warm_released or pool.idle_since is None:
        return None
    return pool.idle_since + timedelta(seconds=pool.idle_release_after_s)


def decide(now: datetime, pools: Sequence[PoolIdle]) -> PoolIdleDecision:
    """Which pools release their warm capacity; the rest counted by the gate that refused."""
    decision = PoolIdleDecision([])
    for pool in pools:
        if pool.warm_target <= 0:
            decision.refusals["NO_WARM_TARGET"] += 1
        elif pool.warm_released:
            decision.refusals["ALREADY_RELEASED"] += 1
        elif pool.idle_since is None:
            decision.refusals["HAS_WORK"] += 1
        elif now - pool.idle_since < timedelta(seconds=pool.idle_release_after_s):
            decision.refusals["NOT_IDLE_LONG_ENOUGH"] += 1
        else:
            decision.release.append(pool)
    return decision


class PoolIdleRelease:
    name = NAME

    def __init__(self, sessions: sessionmaker[Session], lease: LeaderLease) -> None:
        self.sessions = sessions
        self.lease = lease

    def scan(self) -> list[PoolIdle]:
        P = models.Pool
        with self.sessions() as session:
            rows = session.execute(
                select(P.id, P.warm_target, P.idle_since, P.idle_release_after_s, P.warm_released)
            ).all()
        return [PoolIdle(r[0], int(r[1]), r[2], float(r[3]), bool(r[4])) for r in rows]

    def run(self, now: datetime) -> TickReport:
        report = TickReport()
        decision = decide(now, self.scan())
        report.refusals.update(decision.refusals)
        for pool in decision.release:
            with self.sessions() as session, session.begin():
                self.lease.fence(session)
                if self._release(session, now, pool):
                    report.actions["released"] += 1
                else:
                    report.refusals["CHANGED_SINCE_SCAN"] += 1
        return report

    def _release(self, session: Session, now: datetime, pool: PoolIdle) -> bool:
        claimed = session.execute(
            update(models.Pool)
            .where(
                models.Pool.id == pool.pool_id,
                models.Pool.idle_since == pool.idle_since,
                models.Pool.warm_released.is_(False),
            )
            .values(**RELEASED)
            .execution_options(synchronize_session=False)
        )
        if getattr(claimed, "rowcount", 0) != 1:
            return False  # work came back meanwhile: the pool keeps its warm capacity
        unpinned = list(
            session.execute(
                update(models.Machine)
                .where(models.Machine.pool_id == pool.pool_id, models.Machine.warm_held.is_(True))
                .values(**UNPINNED)
                .returning(models.Machine.id)
            ).scalars()
        )
        assert pool.idle_since is not None
        idle_min = (now - pool.idle_since).total_seconds() / 60
        held = ", ".join(sorted(unpinned)) or "-"
        record_failure(
            session,
            now,
            DETECTS.value,
            NAME,
            details=(
                f"pool {pool.pool_id} had no work for {idle_min:.0f} min (its idle time is "
                f"{pool.idle_release_after_s / 60:g} min): its warm capacity of {pool.warm_target} "
                f"is released to the money chain ({len(unpinned)} machine(s) no longer held: {held})"
            ),
        )
        return True
