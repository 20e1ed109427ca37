"""Periodic work for timer-driven services, run only by the leader.

A :class:`Ticker` runs named tasks each at its own cadence on the injected clock, renews
the leader lease between them — and, while a task runs, from a keeper thread, so a pass
longer than the lease (a reaper net waiting out a provider's bounded stop) does not hand
leadership to a standby mid-pass — and records each run in ``watchdog_stats`` so operators
can see every watchdog's cadence, last run and counts. A task returns a
:class:`TickReport` of what it did and what it refused, by gate.

The database going away is not a bug of a task's: the Ticker logs one line, backs off
until it answers again, and never dies of it. A pass cut off by the outage is run again
whole, in a new term of the lease (gpufleet.common.leadership). And after the database
returns, no pass runs for ``settle_s`` of the clock: the machines' reports, heartbeats and
lease renewals were refused while it was gone, so the silence a net would read then is
the outage's, not the machines'. ``settle_s`` is a few of the agents' report periods, so
every live machine and attempt has reported again before any net judges them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import Clock
from gpufleet.common.db.models import WatchdogStat
from gpufleet.common.db.outage import DatabaseWatch, describe, is_outage
from gpufleet.common.errors import Fenced
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.telemetry import tracer

log = logging.getLogger(__name__)


@dataclass
class TickReport:
    """What one run of a task did: actions by kind, refusals by gate."""

    actions: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)


@dataclass
class PeriodicTask:
    name: str
    cadence_s: float
    run: Callable[[datetime], TickReport]
    next_at: datetime | None = None


class Ticker:
    """Runs each task at its cadence while this replica holds the lease."""

    def __init__(
        self,
        service: str,
        clock: Clock,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        tasks: list[PeriodicTask],
        renew_s: float,
        *,
        watch: DatabaseWatch | None = None,
        settle_s: float = 0.0,
        max_backoff_s: float = 5.0,
    ) -> None:
        self.service = service
        self.clock = clock
        self.sessions = sessions
        self.lease = lease
        self.tasks = tasks
        self.renew_s = renew_s
        self.watch = watch
        self.settle = timedelta(seconds=settle_s)
        self.max_backoff_s = max_backoff_s
        self._tracer = tracer(f"gpufleet.{service}")
        self._registered = False
        self._database_back = threading.Event()
        if watch is not None:
            watch.on_change(self._database_changed)
        try:
            self._register()
        except Exception as exc:
            if not is_outage(exc):
                raise
            # Started while the database is away: registered at the first pass instead.
            log.warning("%s: the database is unavailable; the watchdogs register once it answers", service)

    def _database_changed(self, up: bool) -> None:
        if up:
            self._database_back.set()  # end the loop's back-off at once
        else:
            self.lease.interrupted()

    def _back_off(self, seconds: float, stop: threading.Event) -> bool:
        """Wait ``seconds`` of real time, or less if the watch sees the database return;
        True when ``stop`` was set."""
        deadline = time.monotonic() + seconds
        while not stop.is_set() and not self._database_back.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            stop.wait(min(left, 0.1))
        self._database_back.clear()
        return stop.is_set()

    def settled(self) -> bool:
        """Whether passes may run: the database answers, and it has answered for
        ``settle_s`` of the clock since it last came back."""
        if self.watch is None:
            return True
        if not self.watch.up:
            return False
        back = self.watch.recovered_at
        return back is None or self.clock.now() >= back + self.settle

    def _register(self) -> None:
        if self._registered:
            return
        with self.sessions() as session, session.begin():
            for task in self.tasks:
                row = session.get(WatchdogStat, task.name)
                if row is None:
                    session.add(
                        WatchdogStat(
                            name=task.name,
                            service=self.service,
                            cadence_s=task.cadence_s,
                            runs=0,
                            actions={},
                            refusals={},
                        )
                    )
                else:
                    row.cadence_s = task.cadence_s
                    row.service = self.service
        self._registered = True

    def run_due(self) -> None:
        """Run every task whose time has come (one pass; leader only). A pass the
        database's loss cuts off ends here, its task still due: it runs again whole once
        the lease is re-acquired and the fleet has settled."""
        if not self.settled():
            return
        self._register()
        for task in self.tasks:
            now = self.clock.now()
            if task.next_at is not None and now < task.next_at:
                continue
            if not self.lease.is_leader:
                return
            with (
                self._tracer.start_as_current_span(f"{self.service}.{task.name}.tick") as span,
                self._lease_kept(task.name),
                self.lease.term(),
            ):
                try:
                    report = task.run(now)
                except Fenced as exc:
                    log.warning("%s: %s", task.name, exc)
                    return
                except Exception as exc:
                    if is_outage(exc):
                        self._lost_database(task.name, exc)
                        return
                    log.exception("task %s failed; it runs again at its next cadence", task.name)
                    report = TickReport()
                    report.refusals["ERROR"] += 1
                span.set_attribute("gpufleet.actions", sum(report.actions.values()))
                span.set_attribute("gpufleet.refusals", sum(report.refusals.values()))
            task.next_at = now + timedelta(seconds=task.cadence_s)
            self._record(task, now, report)

    def _lost_database(self, during: str, exc: BaseException) -> None:
        """One line, no stack: a known condition, not a bug of the task's."""
        self.lease.interrupted()
        if self.watch is not None:
            self.watch.suspect()
        log.warning("%s: the database is unavailable (%s); backing off", during, describe(exc))

    @contextlib.contextmanager
    def _lease_kept(self, task: str) -> Iterator[None]:
        """Renew the lease every ``renew_s`` while a task runs.

        The lease stays what it is for: a replica that is paused (SIGSTOP, a long GC, a
        VM migration) pauses this thread too, its lease runs out and its next write is
        fenced. What it no longer conflates is a live leader whose pass is slow (every
        call in a pass has its own bounded deadline) with a dead one. A renewal that
        finds another holder stops renewing; the task's next fenced write is refused."""
        done = threading.Event()
        # Waited in real seconds on the event itself, so the task's end stops the keeper at
        # once (and the lease is never renewed after the ticker has released it).
        every = self.clock.real_seconds(self.renew_s)

        def keep() -> None:
            while not done.wait(every):
                try:
                    if not self.lease.try_acquire():
                        log.warning("lost the %s lease while %s ran", self.service, task)
                        return
                except Exception as exc:
                    if is_outage(exc):
                        self._lost_database(f"lease renewal during {task}", exc)
                    else:
                        log.exception("leader lease renewal during %s failed", task)

        keeper = threading.Thread(target=keep, name=f"{self.service}-lease-keeper", daemon=True)
        keeper.start()
        try:
            yield
        finally:
            done.set()
            keeper.join()

    def _record(self, task: PeriodicTask, now: datetime, report: TickReport) -> None:
        with self.sessions() as session, session.begin():
            row = session.execute(select(WatchdogStat).where(WatchdogStat.name == task.name)).scalar_one()
            row.last_run_at = now
            row.runs = (row.runs or 0) + 1
            row.actions = dict(Counter(row.actions or {}) + report.actions)
            row.refusals = dict(Counter(row.refusals or {}) + report.refusals)

    def next_wait(self) -> float:
        """Seconds of clock time until the next task or lease renewal is due."""
        now = self.clock.now()
        waits = [self.renew_s]
        for task in self.tasks:
            if task.next_at is None:
                return 0.0
            waits.append((task.next_at - now).total_seconds())
        return max(0.0, min(waits))

    def run_forever(self, stop: threading.Event) -> None:
        """Acquire/renew the lease and run due tasks until ``stop`` is set. While the
        database is away it only retries, every back-off of real seconds (doubling up to
        ``max_backoff_s``): nothing else can be done without it."""
        backoff = 0.0
        while not stop.is_set():
            ran = False
            try:
                self.lease.try_acquire()
                if self.lease.is_leader and self.settled():
                    self.run_due()
                    ran = True
                backoff = 0.0
            except Exception as exc:
                if not is_outage(exc):
                    log.exception("the %s leader's loop failed", self.service)
                else:
                    self._lost_database("the leader's loop", exc)
                    backoff = min(max(2 * backoff, 0.25), self.max_backoff_s)
                    if self._back_off(backoff, stop):
                        break
                    continue
            # Settling after an outage, a standby and a failed pass all look again at the
            # next renewal.
            wait = self.next_wait() if ran else self.renew_s
            if self.clock.wait(min(wait, self.renew_s), stop):
                break
        try:
            self.lease.release()
        except Exception:
            log.exception("could not release the leader lease")
