"""Leader election with epoch fencing (DESIGN §9).

Timer-driven services (scheduler, reaper, sweeper) may run as several replicas; one row
per service in ``leader_leases`` names the holder, an epoch that grows on every change of
holder, and when the lease ends. The leader renews it; every write a leader makes calls
:meth:`LeaderLease.fence` inside the same transaction, which locks the lease row and
refuses the write if the epoch moved on — so a leader that was paused past its lease
(SIGSTOP, a long GC, a VM migration) cannot act on stale decisions when it wakes.

A leader that lost sight of the database (a renewal failed: a restart, a failover) cannot
know whether its lease lapsed meanwhile, nor what changed: when the database is back its
next acquisition starts a new term (a new epoch) even if the row still names it, and a
pass that read its snapshot in the old term (:meth:`LeaderLease.term`) is refused every
write after that — the fence compares the row with the epoch the pass began under, not
with whatever the lease holds now.

Each lease reports ``gpufleet.leader.leading`` (1 while held, 0 while standing by), so
every timer service shows whether it has a leader without a line of its own: summed over
replicas it is 1 in a healthy deployment, 0 with none.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import Clock
from gpufleet.common.db.models import LeaderLease as LeaseRow
from gpufleet.common.errors import Fenced
from gpufleet.common.metrics.catalog import LEADER_LEADING
from gpufleet.common.metrics.instruments import PROCESS, Instruments, Observing

log = logging.getLogger(__name__)


class LeaderLease:
    """One replica's view of a named lease."""

    def __init__(
        self,
        name: str,
        holder: str,
        clock: Clock,
        sessions: sessionmaker[Session],
        ttl_s: float,
        *,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.name = name
        self.holder = holder
        self.clock = clock
        self.sessions = sessions
        self.ttl = timedelta(seconds=ttl_s)
        self.epoch: int | None = None
        # When the lease this replica last wrote runs out: past it another replica may lead,
        # whatever ``epoch`` still says (a paused process learns it only at its next write).
        self._held_until: datetime | None = None
        # Set when a renewal failed or the database was seen gone: the next acquisition is
        # a new term, and passes of the old one write nothing until then.
        self._interrupted = False
        # The epoch the pass running on this thread read its snapshot under (see term()).
        self._pass = threading.local()
        self._observing = _observe_leading(self, instruments)

    @property
    def is_leader(self) -> bool:
        return self.epoch is not None

    def leading(self) -> bool:
        """Whether this replica holds the lease now: it won it, and the term it last wrote
        has not run out. Stricter than :attr:`is_leader`, which a replica paused past its
        lease still answers True until its next renewal or fenced write tells it: the gauge
        must not count two leaders for that while."""
        held_until = self._held_until
        return self.epoch is not None and held_until is not None and self.clock.now() < held_until

    def interrupted(self) -> None:
        """The database went away (or a renewal failed): this replica may have lost the
        lease meanwhile without knowing it. Its next acquisition starts a new term."""
        if self.epoch is not None and not self._interrupted:
            log.warning("lost sight of the database while leading %s (epoch %d)", self.name, self.epoch)
        self._interrupted = True

    @contextlib.contextmanager
    def term(self) -> Iterator[None]:
        """Run a pass under the current term: every :meth:`fence` on this thread inside it
        refuses to write once the lease was interrupted or re-acquired, so nothing the
        pass read before an outage is applied after it."""
        self._pass.epoch = self.epoch
        try:
            yield
        finally:
            self._pass.epoch = None

    def try_acquire(self) -> bool:
        """Take or renew the lease; returns whether this replica now leads."""
        try:
            return self._try_acquire()
        except Exception:
            # Whatever failed (most often the database itself), this renewal did not
            # happen: whether the lease still holds is unknown until the next one.
            self.interrupted()
            raise

    def _try_acquire(self) -> bool:
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
                    self._held_until = None
                    return False
                self._became(1, expires)
                return True
            if row.holder == self.holder and row.epoch == self.epoch and not self._interrupted:
                row.expires_at = expires
                self._held_until = expires
                return True
            if row.expires_at > now and row.holder != self.holder:
                self._lost()
                return False
            # Expired, ours from an earlier life, or ours across an outage: take over with
            # a new epoch.
            row.holder = self.holder
            row.epoch = row.epoch + 1
            row.expires_at = expires
            self._became(row.epoch, expires)
            return True

    def _became(self, epoch: int, expires: datetime) -> None:
        if self.epoch != epoch:
            log.info(
                "leader of %s with epoch %d%s",
                self.name,
                epoch,
                " (a new term after losing sight of the database)" if self._interrupted else "",
                extra={"fields": {"lease": self.name, "epoch": epoch}},
            )
        self.epoch = epoch
        self._held_until = expires
        self._interrupted = False

    def _lost(self) -> None:
        if self.epoch is not None:
            log.warning("lost leadership of %s (epoch %d)", self.name, self.epoch)
        self.epoch = None
        self._held_until = None
        self._interrupted = False

    def fence(self, session: Session) -> int:
        """Inside a write transaction: lock the lease row and refuse a stale epoch — and,
        inside a :meth:`term`, a pass older than the lease's current term."""
        if self.epoch is None:
            raise Fenced(f"not the leader of {self.name}")
        began = getattr(self._pass, "epoch", None)
        if began is not None and (self._interrupted or began != self.epoch):
            raise Fenced(
                f"this pass read its snapshot in epoch {began} of {self.name}, before the "
                "database was lost; the lease must be re-acquired and the pass run again"
            )
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
        self._held_until = None

    def close(self) -> None:
        """Stop reporting ``gpufleet.leader.leading`` for this lease (a lease that is
        garbage-collected stops by itself)."""
        self._observing.close()


def _observe_leading(lease: LeaderLease, instruments: Instruments) -> Observing:
    """Report the lease's :meth:`~LeaderLease.leading` as 1 or 0 at every collection.

    The source holds the lease weakly: a lease nobody keeps (a test's, a replaced one)
    leaves the gauge at its next collection instead of reporting a stale 0 or 1 for the
    life of the process."""
    ref = weakref.ref(lease)
    name = lease.name

    def source() -> Iterator[tuple[float, Mapping[str, str]]]:
        held = ref()
        if held is None:
            observing.close()
            return
        yield (1.0 if held.leading() else 0.0), {"lease": name}

    observing = instruments.observe(LEADER_LEADING, source)
    return observing
