"""Tells a human when an incident opens or is resolved, without anyone polling: the reaper
leader reads the incidents table's changes and posts each to ``GPUFLEET_INCIDENT_WEBHOOK_URL``.

It reads the table, not the writers: an incident opened by any service (the scheduler's
paid-wait watchdog, a ledger row's outcome, the sweeper) is seen the same way, and no
writer waits on a webhook. Two threads of its own, so neither a net nor a transaction ever
waits on the receiver:

- the *poller* (leader only) reads, every ``poll_s`` of the clock, the incidents opened or
  resolved since its cursor and puts each change in a bounded outbox — one that is full
  drops the change (counted ``dropped``) rather than growing without bound behind a
  receiver that is down — and then a checkpoint: "everything up to now is handed over";
- the *sender* posts the changes in order (:class:`~gpufleet.reaper.incident_webhook.WebhookSender`,
  retried with back-off, counted ``sent`` or ``failed``) and, on reaching a checkpoint,
  writes it as the cursor.

The cursor lives in the database, as this notifier's own ``watchdog_stats`` row
(``incident_webhook``): its ``last_run_at`` is the time through which every change has been
posted or given up, its ``actions`` the posts by outcome, and ``gpufleet watchdogs`` and
the watchdog-silent alert see it like any watchdog. It is written only after the posts
before it settle, and under the leader's fence, so a restart or a new leader resumes from
it: what was handed over and not yet settled is posted again (at least once), nothing that
settled is, and nothing that changed while no reaper ran is skipped.

Changes are found by their own timestamps (``at``, ``resolved_at``), written by other
processes with their own ``now``: a row can commit a little after its timestamp, or come
from a clock a little ahead. So each poll reads back ``lookback_s`` before its cursor and
skips what it already handed over (the changes it has seen, kept for that window). After
a restart the changes in that window before the stored cursor count as handed over: the
previous leader's checkpoint says they were.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, or_, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import Clock
from gpufleet.common.db.models import Incident, WatchdogStat
from gpufleet.common.db.outage import describe, is_outage
from gpufleet.common.errors import Fenced
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.metrics.catalog import INCIDENT_NOTIFICATIONS
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.reaper.incident_webhook import (
    Delivery,
    IncidentChange,
    Status,
    WebhookSender,
    message,
)

log = logging.getLogger(__name__)

# Its watchdog_stats row: the cursor, and its runs and posts for `gpufleet watchdogs`.
NAME = "incident_webhook"
SERVICE = "reaper"

_Key = tuple[int, Status]


@dataclass(frozen=True)
class NotifierPolicy:
    """How often to look (clock seconds), how far back (clock seconds), how much to hold."""

    poll_s: float = 10.0
    lookback_s: float = 600.0
    outbox_size: int = 100


# Items carry the poller's generation: it begins anew each time the poller takes up the
# stored cursor (as a new leader, or again after losing the lease), and a checkpoint is
# written only if no change of its generation was left unsettled.
@dataclass(frozen=True)
class _Handed:
    change: IncidentChange
    generation: int


@dataclass(frozen=True)
class _Checkpoint:
    """Every change up to ``through`` has been put in the outbox before this."""

    through: datetime
    generation: int


_Item = _Handed | _Checkpoint


class _Outbox:
    """The changes handed to the sender, at most ``size`` of them; at most one checkpoint
    waits at the tail (a newer one replaces it: it says more)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: deque[_Item] = deque()
        self._changes = 0
        self._busy = False
        self._cond = threading.Condition()

    def put(self, handed: _Handed) -> bool:
        with self._cond:
            if self._changes >= self.size:
                return False
            self._items.append(handed)
            self._changes += 1
            self._cond.notify_all()
            return True

    def checkpoint(self, checkpoint: _Checkpoint) -> None:
        with self._cond:
            if self._items and isinstance(self._items[-1], _Checkpoint):
                self._items.pop()
            self._items.append(checkpoint)
            self._cond.notify_all()

    def take(self, stop: threading.Event, poll_s: float = 0.2) -> _Item | None:
        """The next item (the sender is busy with it until :meth:`done`); None once ``stop``
        is set — except a checkpoint at the head, which is still written: the changes
        before it have settled."""
        with self._cond:
            while not self._items or (stop.is_set() and not isinstance(self._items[0], _Checkpoint)):
                if stop.is_set():
                    return None
                self._cond.wait(poll_s)
            item = self._items.popleft()
            if isinstance(item, _Handed):
                self._changes -= 1
            self._busy = True
            return item

    def done(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            self._items.clear()
            self._changes = 0
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._items and not self._busy, timeout_s)


class IncidentNotifier:
    """The poller and the sender (see the module's docstring); ``start()``, ``close()``."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        lease: LeaderLease,
        sender: WebhookSender,
        policy: NotifierPolicy,
        *,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self.lease = lease
        self.sender = sender
        self.policy = policy
        self._counted = instruments.counter(INCIDENT_NOTIFICATIONS)
        self._outbox = _Outbox(policy.outbox_size)
        # The poller's own: its cursor (None until it has read the stored one as leader) and
        # the changes it handed over within the look-back window, by when they happened.
        self._cursor: datetime | None = None
        self._seen: dict[_Key, datetime] = {}
        self._generation = 0
        # The sender's: generations with a change it did not settle (their checkpoints
        # would skip it).
        self._unsettled: set[int] = set()
        # Posts by outcome since the last checkpoint was written (the row's `actions`).
        self._tally: Counter[str] = Counter()
        self._tally_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- life -------------------------------------------------------------------------------
    def start(self) -> None:
        """The sender, and the poller every ``poll_s`` of the clock."""
        self.start_sending()
        self._spawn(self._poll_forever, "incident-webhook-poll")

    def start_sending(self) -> None:
        """The sender alone: whoever calls :meth:`poll` decides when to look (a test)."""
        self._spawn(self._send_forever, "incident-webhook-send")

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def close(self, timeout_s: float | None = None) -> None:
        """Stop both threads. A change still out is not settled: the cursor stays before it,
        and the next leader posts it."""
        self._stop.set()
        wait = timeout_s if timeout_s is not None else self.sender.policy.timeout_s + 5.0
        for thread in self._threads:
            thread.join(wait)

    def wait_idle(self, timeout_s: float) -> bool:
        """Whether everything handed to the sender has settled within ``timeout_s`` real seconds."""
        return self._outbox.wait_idle(timeout_s)

    # -- the poller ---------------------------------------------------------------------------
    def _poll_forever(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as exc:
                if is_outage(exc):  # a known condition (PostgreSQL restarting): one line, no stack
                    log.warning(
                        "incident webhook: the database is unavailable (%s); again next poll", describe(exc)
                    )
                else:
                    log.exception("incident webhook: reading the incidents failed; again next poll")
            if self.clock.wait(self.policy.poll_s, self._stop):
                return

    def poll(self) -> int:
        """One look (leader only): hand every change since the cursor to the sender, then a
        checkpoint. Returns the changes handed over."""
        if not self.lease.leading():
            if self._cursor is not None:
                # Whoever leads now resumes from the stored cursor; what this replica still
                # holds is theirs to post.
                self._cursor = None
                self._seen.clear()
                self._outbox.clear()
            return 0
        now = self.clock.now()
        if self._cursor is None:
            self._resume(now)
        assert self._cursor is not None
        since = self._cursor - timedelta(seconds=self.policy.lookback_s)
        changes = [c for c in self._read(since) if (c.incident_id, c.status) not in self._seen]
        changes.sort(key=lambda c: (c.happened_at, c.status is Status.RESOLVED, c.incident_id))
        for change in changes:
            self._seen[(change.incident_id, change.status)] = change.happened_at
            if not self._outbox.put(_Handed(change, self._generation)):
                self._counted.add(1, {"outcome": "dropped"})
                self._tally_add("dropped")
                log.warning(
                    "incident webhook: outbox full (%d); incident %d %s not posted",
                    self.policy.outbox_size,
                    change.incident_id,
                    change.status.value,
                )
        self._cursor = max(self._cursor, now)
        self._outbox.checkpoint(_Checkpoint(self._cursor, self._generation))
        horizon = self._cursor - timedelta(seconds=self.policy.lookback_s)
        self._seen = {k: at for k, at in self._seen.items() if at > horizon}
        return len(changes)

    def _resume(self, now: datetime) -> None:
        """Take up the stored cursor (or start now, the first time the webhook runs): the
        changes in the look-back window before it were handed over by the leader that wrote
        it."""
        with self.sessions() as session, session.begin():
            row = session.get(WatchdogStat, NAME)
            if row is None:
                session.add(
                    WatchdogStat(
                        name=NAME,
                        service=SERVICE,
                        cadence_s=self.policy.poll_s,
                        last_run_at=now,
                        runs=0,
                        actions={},
                        refusals={},
                    )
                )
                cursor = now
            else:
                row.cadence_s = self.policy.poll_s
                cursor = row.last_run_at or now
        since = cursor - timedelta(seconds=self.policy.lookback_s)
        self._seen = {
            (c.incident_id, c.status): c.happened_at for c in self._read(since) if c.happened_at <= cursor
        }
        self._cursor = cursor
        self._generation += 1
        log.info("incident webhook: posting changes after %s", cursor.isoformat())

    def _read(self, since: datetime) -> list[IncidentChange]:
        with self.sessions() as session:
            rows = session.execute(
                select(Incident).where(or_(Incident.at > since, Incident.resolved_at > since))
            ).scalars()
            changes: list[IncidentChange] = []
            for row in rows:
                if row.at > since:
                    changes.append(_change(row, Status.FIRING))
                if row.resolved_at is not None and row.resolved_at > since:
                    changes.append(_change(row, Status.RESOLVED))
            return changes

    # -- the sender ---------------------------------------------------------------------------
    def _send_forever(self) -> None:
        while True:
            item = self._outbox.take(self._stop)
            if item is None:
                return
            try:
                if isinstance(item, _Checkpoint):
                    if item.generation not in self._unsettled:
                        self._write_cursor(item.through)
                elif not self._send(item.change):
                    self._unsettled.add(item.generation)
            except Exception as exc:
                if is_outage(exc):  # the cursor's write met a restarting database: the next poll
                    log.warning("incident webhook: the database is unavailable (%s); going on", describe(exc))
                else:
                    log.exception("incident webhook: the sender failed on one item; going on")
            finally:
                self._outbox.done()

    def _send(self, change: IncidentChange) -> bool:
        """Post ``change``; returns whether it settled (sent, or failed for good)."""
        if not self.lease.leading():
            return False  # the new leader posts it: the stored cursor is still before it
        outcome = self.sender.deliver(message(change, self.sender.policy.format), self._stop)
        if outcome is Delivery.STOPPED:
            return False  # the cursor stays before it: posted after the restart
        self._counted.add(1, {"outcome": outcome.value})
        self._tally_add(outcome.value)
        log.log(
            logging.INFO if outcome is Delivery.SENT else logging.WARNING,
            "incident webhook: incident %d %s %s",
            change.incident_id,
            change.status.value,
            outcome.value,
            extra={
                "fields": {
                    "incident_id": change.incident_id,
                    "failure_class": change.failure_class,
                    "status": change.status.value,
                    "outcome": outcome.value,
                }
            },
        )
        return True

    def _write_cursor(self, through: datetime) -> None:
        with self._tally_lock:
            tally, self._tally = self._tally, Counter()
        try:
            with self.sessions() as session, session.begin():
                self.lease.fence(session)
                row = session.execute(
                    select(WatchdogStat).where(WatchdogStat.name == NAME).with_for_update()
                ).scalar_one()
                if row.last_run_at is None or through > row.last_run_at:
                    row.last_run_at = through
                row.runs = (row.runs or 0) + 1
                row.actions = dict(Counter(row.actions or {}) + tally)
        except Fenced as exc:
            log.info("incident webhook: cursor not written (%s)", exc)

    def _tally_add(self, outcome: str) -> None:
        with self._tally_lock:
            self._tally[outcome] += 1


def _change(row: Incident, status: Status) -> IncidentChange:
    return IncidentChange(
        incident_id=row.id,
        failure_class=row.failure_class,
        status=status,
        summary=row.summary,
        opened_at=row.at,
        resolved_at=row.resolved_at,
        machine_id=row.machine_id,
        job_id=row.job_id,
    )


def retire(sessions: sessionmaker[Session]) -> None:
    """With the webhook turned off, remove its row: a watchdog that no longer runs would
    otherwise read as one gone silent (and page) forever. Turned on again, it starts from
    then, not from where it stopped."""
    with sessions() as session, session.begin():
        session.execute(delete(WatchdogStat).where(WatchdogStat.name == NAME))
