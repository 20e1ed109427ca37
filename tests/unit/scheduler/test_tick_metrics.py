"""The fleet tick's metrics from what it already holds: machines counted by state, pool and
provider from its snapshot (a zero for every empty state of a place the fleet has), only
while that snapshot is fresh, and assignments counted by their machine's pool."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.common.clock import ManualClock
from gpufleet.common.db.enums import MachineState
from gpufleet.common.metrics.catalog import FLEET_MACHINES, SCHEDULER_ASSIGNMENTS, SCHEDULER_DISPATCH_FAILURES
from gpufleet.scheduler.tick.dispatch_failure import DispatchFailure
from gpufleet.scheduler.tick.metrics import TickMetrics, machines_by_state
from gpufleet.scheduler.tick.model import FleetSnapshot, MachineView, OfferingView
from tests.support.metrics import MetricsProbe
from tests.unit.scheduler import fleet_views

NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
TICK_S = 5.0
LIVE_STATES = [s.value for s in MachineState if s is not MachineState.DESTROYED]


def machine(mid: str, state: str, pool: str | None, provider: str) -> MachineView:
    return fleet_views.machine(
        mid, state, pool, provider=provider, slots=2, worker_report_at=None, hourly_price_micros=800_000
    )


def offering(oid: str, pool: str, provider: str) -> OfferingView:
    return OfferingView(oid, pool, 0, provider, "r-1", "r-1a", 2, "ON_DEMAND", 800_000)


def snapshot(
    machines: list[MachineView], offerings: list[OfferingView], now: datetime = NOW
) -> FleetSnapshot:
    return FleetSnapshot(
        now=now,
        queued=[],
        running_per_workspace={},
        workspace_limits={},
        machines=machines,
        pools={},
        offerings=offerings,
        live_attempts=[],
    )


FLEET = snapshot(
    [
        machine("m-1", "READY", "l4", "SIM"),
        machine("m-2", "READY", "l4", "SIM"),
        machine("m-3", "STOPPED", "l4", "SIM"),
        machine("box", "READY", None, "LOCAL"),
    ],
    [offering("sim-l4", "l4", "SIM"), offering("gcp-a100", "a100", "GCP")],
)


@pytest.fixture
def probe() -> Iterator[MetricsProbe]:
    probe = MetricsProbe()
    yield probe
    probe.close()


def test_machines_are_counted_by_state_pool_and_provider_with_zeros_for_empty_states() -> None:
    counts = machines_by_state(FLEET)
    places = {("l4", "SIM"), ("a100", "GCP"), ("none", "LOCAL")}
    assert set(counts) == {(state, *place) for state in LIVE_STATES for place in places}
    assert {k: n for k, n in counts.items() if n} == {
        ("READY", "l4", "SIM"): 2,
        ("STOPPED", "l4", "SIM"): 1,
        ("READY", "none", "LOCAL"): 1,
    }


def test_the_gauge_reports_the_last_snapshot_only_while_it_is_fresh(probe: MetricsProbe) -> None:
    clock = ManualClock(NOW)
    metrics = TickMetrics(probe.instruments, clock, fresh_s=3 * TICK_S)
    assert probe.series(FLEET_MACHINES.name) == {}  # no tick yet
    metrics.saw(FLEET)
    assert probe.value(FLEET_MACHINES.name, state="READY", pool="l4", provider="SIM") == 2
    assert len(probe.series(FLEET_MACHINES.name)) == 3 * len(LIVE_STATES)

    clock.advance(timedelta(seconds=3 * TICK_S + 1))  # no tick since: deposed, or stuck
    assert probe.series(FLEET_MACHINES.name) == {}
    metrics.saw(snapshot(FLEET.machines[:1], [], now=clock.now()))
    assert probe.value(FLEET_MACHINES.name, state="READY", pool="l4", provider="SIM") == 1

    metrics.close()
    assert probe.series(FLEET_MACHINES.name) == {}


def test_assignments_are_counted_by_their_machines_pool(probe: MetricsProbe) -> None:
    metrics = TickMetrics(probe.instruments, ManualClock(NOW), fresh_s=3 * TICK_S)
    metrics.assigned(["m-1", "m-1", "m-2", "box"], FLEET)
    metrics.assigned([], FLEET)
    assert probe.series(SCHEDULER_ASSIGNMENTS.name) == {(("pool", "l4"),): 3, (("pool", "none"),): 1}
    metrics.dispatch_failed(DispatchFailure.AGENT_TIMEOUT, 2)
    metrics.dispatch_failed(DispatchFailure.NOT_DISPATCHED, 0)
    assert probe.series(SCHEDULER_DISPATCH_FAILURES.name) == {(("cause", "agent_timeout"),): 2}
    metrics.close()
