"""The gauges that are the database's state, read by the reaper leader from a real
PostgreSQL: incidents open by class (acknowledged and resolved ones are not), quarantines in
force by kind and provider (cleared and expired ones are not), every watchdog's last run and
cadence — reported by the leader only, and no longer once it loses the lease."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import Catalog, PoolSpec
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.enums import IncidentState
from gpufleet.common.db.models import Incident, Quarantine, WatchdogStat
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, OutcomeTarget, open_incident, record_failure
from gpufleet.common.metrics.catalog import (
    INCIDENTS_OPEN,
    QUARANTINES_ACTIVE,
    WATCHDOG_CADENCE,
    WATCHDOG_LAST_RUN,
)
from gpufleet.reaper.fleet_state_gauges import INCIDENT_CLASSES, FleetStateGauges
from gpufleet.scheduler.catalog_sync import sync_catalog
from tests.support.fleet_rows import sim_l4_offering
from tests.support.metrics import MetricsProbe

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        sync_catalog(
            s,
            Catalog(
                plans=[],
                workspaces=[],
                kinds=[],
                pools=[PoolSpec(id="l4", slots_per_machine=2, offerings=[sim_l4_offering()])],
            ),
        )
    yield sessions
    engine.dispose()


def gauges(
    sessions: sessionmaker[Session], clock: ManualClock, holder: str
) -> tuple[FleetStateGauges, MetricsProbe]:
    probe = MetricsProbe()
    lease = LeaderLease("reaper", holder, clock, sessions, ttl_s=15, instruments=probe.instruments)
    lease.try_acquire()
    return FleetStateGauges(sessions, clock, lease, every_s=15, instruments=probe.instruments), probe


def incidents_open(probe: MetricsProbe) -> dict[str, float]:
    return {dict(k)["failure_class"]: v for k, v in probe.series(INCIDENTS_OPEN.name).items()}


def test_incidents_open_count_the_open_ones_by_class_with_a_zero_for_every_class(
    sessions: sessionmaker[Session],
) -> None:
    clock = ManualClock(T0)
    state, probe = gauges(sessions, clock, "reaper-a")
    with sessions() as s, s.begin():
        # Two through the ledger (a stockout quarantines its offering and opens one), one
        # from the scheduler's paid-wait watchdog, and one each acknowledged and resolved.
        for _ in range(2):
            record_failure(
                s, T0, "stockout", "provisioner", apply=True, target=OutcomeTarget(offering_id="sim-l4")
            )
        open_incident(s, T0, "paid_wait", "job 1 waited 31 min")
        acked = open_incident(s, T0, "paid_wait", "job 2 waited 31 min")
        over = open_incident(s, T0, "transition_stuck", "m-1 STOPPING for 40 min")
        s.flush()
        assert acked is not None and over is not None
        s.execute(
            update(Incident).where(Incident.id == acked.id).values(state=IncidentState.ACKNOWLEDGED.value)
        )
        s.execute(update(Incident).where(Incident.id == over.id).values(state=IncidentState.RESOLVED.value))

    assert state.refresh()
    figures = incidents_open(probe)
    assert figures["stockout"] == 2 and figures["paid_wait"] == 1 and figures["transition_stuck"] == 0
    assert set(figures) == set(INCIDENT_CLASSES)
    assert sum(figures.values()) == 3
    assert FailureClass.PREEMPTED.value not in figures  # never opens one: no series

    with sessions() as s, s.begin():
        s.execute(update(Incident).where(Incident.failure_class == "stockout").values(state="RESOLVED"))
    assert incidents_open(probe)["stockout"] == 2  # a scrape reads the last refresh, not the table
    state.refresh()
    assert incidents_open(probe)["stockout"] == 0
    state.close()
    probe.close()


def test_quarantines_in_force_by_kind_and_provider(sessions: sessionmaker[Session]) -> None:
    clock = ManualClock(T0)
    state, probe = gauges(sessions, clock, "reaper-a")
    with sessions() as s, s.begin():
        s.add_all(
            [
                # An offering's quarantine names no provider: the offering's is used.
                Quarantine(
                    kind="OFFERING", offering_id="sim-l4", created_at=T0, expires_at=T0 + timedelta(hours=1)
                ),
                Quarantine(kind="PROVIDER_REGION", provider="GCP", region="us-east1", created_at=T0),
                Quarantine(kind="PROVIDER_REGION", provider="GCP", region="us-west1", created_at=T0),
                # Cleared, and expired: not in force.
                Quarantine(kind="PROVIDER_REGION", provider="AWS", region="x", created_at=T0, cleared_at=T0),
                Quarantine(kind="OFFERING", offering_id="sim-l4", created_at=T0, expires_at=T0),
            ]
        )
    state.refresh()
    assert probe.series(QUARANTINES_ACTIVE.name) == {
        (("provider", "SIM"), ("quarantine_kind", "OFFERING")): 1,
        (("provider", "SIM"), ("quarantine_kind", "PROVIDER_REGION")): 0,
        (("provider", "GCP"), ("quarantine_kind", "PROVIDER_REGION")): 2,
    }
    clock.advance(timedelta(hours=1))
    state.lease.try_acquire()
    state.refresh()
    assert probe.value(QUARANTINES_ACTIVE.name, provider="SIM", quarantine_kind="OFFERING") == 0
    state.close()
    probe.close()


def test_every_watchdogs_last_run_and_cadence(sessions: sessionmaker[Session]) -> None:
    clock = ManualClock(T0)
    state, probe = gauges(sessions, clock, "reaper-a")
    with sessions() as s, s.begin():
        s.add(WatchdogStat(name="idle_scanner", service="reaper", cadence_s=30, last_run_at=T0, runs=4))
        s.add(WatchdogStat(name="paid_wait", service="scheduler", cadence_s=60, last_run_at=None, runs=0))
    state.refresh()
    assert probe.series(WATCHDOG_LAST_RUN.name) == {(("net", "idle_scanner"),): T0.timestamp()}
    assert probe.series(WATCHDOG_CADENCE.name) == {
        (("net", "idle_scanner"),): 30,
        (("net", "paid_wait"),): 60,
    }
    state.close()
    probe.close()


def test_the_leader_reports_a_standby_does_not_and_a_deposed_leader_stops(
    sessions: sessionmaker[Session],
) -> None:
    clock = ManualClock(T0)
    with sessions() as s, s.begin():
        open_incident(s, T0, "paid_wait", "job 1 waited 31 min")
    a, probe_a = gauges(sessions, clock, "reaper-a")
    b, probe_b = gauges(sessions, clock, "reaper-b")
    assert a.refresh() and not b.refresh()
    assert incidents_open(probe_a)["paid_wait"] == 1
    assert probe_b.series(INCIDENTS_OPEN.name) == {}
    assert probe_b.series(WATCHDOG_CADENCE.name) == {}

    # reaper-a stops renewing (paused); its term runs out and reaper-b takes over.
    clock.advance(16)
    assert b.lease.try_acquire()
    assert b.refresh()
    assert probe_a.series(INCIDENTS_OPEN.name) == {}  # at once, before it even learns it lost
    assert incidents_open(probe_b)["paid_wait"] == 1
    for g, p in ((a, probe_a), (b, probe_b)):
        g.close()
        p.close()


def test_a_stuck_refresh_stops_the_figures_within_three_cadences(sessions: sessionmaker[Session]) -> None:
    clock = ManualClock(T0)
    state, probe = gauges(sessions, clock, "reaper-a")
    state.lease.ttl = timedelta(hours=1)
    state.lease.try_acquire()
    state.refresh()
    clock.advance(45)
    assert probe.series(INCIDENTS_OPEN.name) != {}
    clock.advance(1)
    assert probe.series(INCIDENTS_OPEN.name) == {}
    state.close()
    probe.close()
