"""Leader election with epoch fencing (DESIGN §9).

Timer-driven services (scheduler, reaper, sweeper) may run as several replicas; one row
per service in ``leader_leases`` names the holder, an epoch that grows on every change of
holder, and when the lease ends. The leader renews it; every write a leader makes calls
:meth:`LeaderLease.fence` inside the same transaction, which locks the lease row and
refuses the write if the epoch moved on — so a leader that was paused past its lease
(SIGSTOP, a long GC, a VM migration) cannot act on stale decisions when it wakes.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import Clock
from gpufleet.common.db.models import LeaderLease as LeaseRow
from gpufleet.common.errors import Fenced

log = logging.getLogger(__name__)


class LeaderLease:
    """One replica's view of a named lease."""

    def __init__(
        self, name: str, holder: str, clock: Clock, sessions: sessionmaker[Session], ttl_s: float
    ) -> None:
        self.name = name
        self.holder = holder
        self.clock = clock
        self.sessions = sessions
        self.ttl = timedelta(seconds=ttl_s)
        self.epoch: int | None = None

    @property
    def is_leader(self) -> bool:
        return self.epoch is not None

    def try_acquire(self) -> bool:
        """Take or renew the lease; returns whether this replica now leads."""
        now = self.clock.now()
        expires = now + self.ttl
        with self.sessions() as session, session.begin():
            row = session.execute(
                select(LeaseRow).where(LeaseRow.name == self.name).with_for_update()
            ).scalar_one_or_none()
            if row is None:
                try:
                    with session.begin_nested():
                        session.add(LeaseRow(name=self.name, holder=self.holder, epoch=1, expires_at=expires))
                except IntegrityError:
                    self.epoch = None
                    return False
                self._became(1)
                return True
            if row.holder == self.holder and row.epoch == self.epoch:
                row.expires_at = expires
                return True
            if row.expires_at > now and row.holder != self.holder:
                self._lost()
                return False
            # Expired (or ours from an earlier life): take over with a new epoch.
            row.holder = self.holder
            row.epoch = row.epoch + 1
            row.expires_at = expires
            self._became(row.epoch)
            return True

    def _became(self, epoch: int) -> None:
        if self.epoch != epoch:
            log.info(
                "leader of %s with epoch %d",
                self.name,
                epoch,
                extra={"fields": {"lease": self.name, "epoch": epoch}},
            )
        self.epoch = epoch

    def _lost(self) -> None:
        if self.epoch is not None:
            log.warning("lost leadership of %s (epoch %d)", self.name, self.epoch)
        self.epoch = None

    def fence(self, session: Session) -> int:
        """Inside a write transaction: lock the lease row and refuse a stale epoch."""
        if self.epoch is None:
            raise Fenced(f"not the leader of {self.name}")
        row = session.execute(
            select(LeaseRow.epoch, LeaseRow.holder).where(LeaseRow.name == self.name).with_for_update()
        ).one_or_none()
        if row is None or row.epoch != self.epoch or row.holder != self.holder:
            stale = self.epoch
            self._lost()
            raise Fenced(f"epoch {stale} of {self.name} is no longer current; write refused")
        return self.epoch

    def release(self) -> None:
        """Give the lease up (graceful stop) so another replica takes over at once."""
        if self.epoch is None:
            return
        with self.sessions() as session, session.begin():
            session.execute(
                update(LeaseRow)
                .where(
                    LeaseRow.name == self.name, LeaseRow.holder == self.holder, LeaseRow.epoch == self.epoch
                )
                .values(expires_at=self.clock.now())
            )
        self.epoch = None
