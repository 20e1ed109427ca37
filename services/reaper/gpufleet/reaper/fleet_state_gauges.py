"""Gauges that are the state of the database, kube-state-metrics style: incidents open,
quarantines in force, and every watchdog's last run and cadence.

The tables are written by every service (the ledger's outcomes, the scheduler's paid-wait
watchdog, each service's Ticker), so one process reports them for the deployment: the
reaper leader. A standby reports nothing, or each series would be counted once per
replica. The figures are read by a loop of their own, every ``every_s`` of the clock, with
a few GROUP BY queries in one short read — never at a scrape (a storm of scrapes would be
a storm of queries) and never on a net's thread — and reported only while that read is
fresh (three of its cadences) and this replica leads: a replica that loses the lease
stops reporting at once, one whose loop is stuck within three cadences.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import IncidentState, QuarantineKind
from gpufleet.common.db.models import Incident, Offering, Quarantine, WatchdogStat
from gpufleet.common.db.outage import describe, is_outage
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, in_force_sql, wants_incident
from gpufleet.common.metrics.catalog import (
    INCIDENTS_OPEN,
    QUARANTINES_ACTIVE,
    WATCHDOG_CADENCE,
    WATCHDOG_LAST_RUN,
)
from gpufleet.common.metrics.instruments import PROCESS, Instruments, Observing

log = logging.getLogger(__name__)

# Every class that opens an incident: each is reported, zero when none is open, so an
# incidents panel's series do not come and go (a fixed set: the ledger's own table).
INCIDENT_CLASSES = tuple(sorted(c.value for c in FailureClass if wants_incident(c.value)))
# The provider label of a quarantine whose provider cannot be read (an offering since
# removed from the catalogue).
UNKNOWN_PROVIDER = "unknown"

Series = Iterator[tuple[float, Mapping[str, str]]]


@dataclass(frozen=True)
class FleetState:
    """One read of the tables, at ``read_at`` (the clock's time)."""

    read_at: datetime
    incidents_open: dict[str, int]
    # (quarantine kind, provider) -> quarantines in force
    quarantines: dict[tuple[str, str], int]
    # watchdog -> (cadence seconds, last run or None)
    watchdogs: dict[str, tuple[float, datetime | None]]


def read_fleet_state(session: Session, now: datetime) -> FleetState:
    """The four figures, each one GROUP BY (or a scan of a table of a few dozen rows)."""
    incidents = dict.fromkeys(INCIDENT_CLASSES, 0)
    for failure_class, n in session.execute(
        select(Incident.failure_class, func.count())
        .where(Incident.state == IncidentState.OPEN.value)
        .group_by(Incident.failure_class)
    ):
        incidents[failure_class] = n

    # An offering's quarantine names only the offering: its provider is the offering's.
    provider = func.coalesce(Quarantine.provider, Offering.provider, UNKNOWN_PROVIDER)
    # A zero for each kind and each provider the catalogue's offerings name.
    providers = list(session.execute(select(Offering.provider).distinct()).scalars())
    quarantines = {(kind.value, p): 0 for kind in QuarantineKind for p in providers}
    for kind, prov, n in session.execute(
        select(Quarantine.kind, provider, func.count())
        .select_from(Quarantine)
        .outerjoin(Offering, Offering.id == Quarantine.offering_id)
        .where(*in_force_sql(now))
        .group_by(Quarantine.kind, provider)
    ):
        quarantines[(kind, prov)] = n

    watchdogs = {
        name: (cadence, last)
        for name, cadence, last in session.execute(
            select(WatchdogStat.name, WatchdogStat.cadence_s, WatchdogStat.last_run_at)
        )
    }
    return FleetState(now, incidents, quarantines, watchdogs)


class FleetStateGauges:
    """The four gauges, fed from :meth:`refresh`; ``start()`` runs it every ``every_s``."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        lease: LeaderLease,
        every_s: float,
        *,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self.lease = lease
        self.every_s = every_s
        self.fresh_s = 3 * every_s
        # Replaced whole by the loop, read whole by the metrics reader's thread.
        self._state: FleetState | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observing: list[Observing] = [
            instruments.observe(INCIDENTS_OPEN, self._incidents),
            instruments.observe(QUARANTINES_ACTIVE, self._quarantines),
            instruments.observe(WATCHDOG_LAST_RUN, self._last_runs),
            instruments.observe(WATCHDOG_CADENCE, self._cadences),
        ]

    def refresh(self) -> bool:
        """Read the tables if this replica leads (and forget them if it does not); returns
        whether it read them."""
        if not self.lease.leading():
            self._state = None
            return False
        now = self.clock.now()
        with self.sessions() as session:
            self._state = read_fleet_state(session, now)
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reaper-state-gauges", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.refresh()
            except Exception as exc:
                if is_outage(exc):  # a known condition: one line, no stack
                    log.warning("fleet state gauges: the database is unavailable (%s)", describe(exc))
                else:
                    log.exception(
                        "could not read the fleet's state for its gauges; again in %s s", self.every_s
                    )
            if self.clock.wait(self.every_s, self._stop):
                return

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for observing in self._observing:
            observing.close()

    # -- the gauges' sources (the metrics reader's thread) -----------------------------------
    def _current(self) -> FleetState | None:
        state = self._state
        if state is None or not self.lease.leading():
            return None
        if (self.clock.now() - state.read_at).total_seconds() > self.fresh_s:
            return None  # the loop is stuck: no figure rather than an old one
        return state

    def _incidents(self) -> Series:
        if (state := self._current()) is not None:
            for failure_class, n in state.incidents_open.items():
                yield n, {"failure_class": failure_class}

    def _quarantines(self) -> Series:
        if (state := self._current()) is not None:
            for (kind, provider), n in state.quarantines.items():
                yield n, {"quarantine_kind": kind, "provider": provider}

    def _last_runs(self) -> Series:
        if (state := self._current()) is not None:
            for net, (_cadence, last) in state.watchdogs.items():
                if last is not None:
                    yield last.timestamp(), {"net": net}

    def _cadences(self) -> Series:
        if (state := self._current()) is not None:
            for net, (cadence, _last) in state.watchdogs.items():
                yield cadence, {"net": net}
