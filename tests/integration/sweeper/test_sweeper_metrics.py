"""What the sweeper's passes tell an operator: orphans found, destroyed and refused by
provider, the consecutive failed listings of each provider (the gauge an alert fires on),
and how long a machine the provider took back went unnoticed.

Real parts: PostgreSQL, the sweeper's own passes under its leader lease, and over gRPC the
real ProvisionerService with its sim cloud (or a scripted provisioner, for what the real
one never does: list another deployment's instance, or not answer at all); a manual clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.metrics.catalog import (
    REAPER_DETECTION_LATENCY,
    SWEEPER_LISTING_FAILURES,
    SWEEPER_ORPHANS,
)
from gpufleet.common.provider_errors import Transient
from gpufleet.sweeper.inventory_reconcile import InventoryReconcile
from gpufleet.sweeper.orphan_sweep import OrphanPolicy, OrphanSweep
from gpufleet.v1 import machine_pb2, provisioner_service_pb2
from tests.support import tls
from tests.support.fleet_rows import add_machine, machine
from tests.support.metrics import MetricsProbe
from tests.support.scripted_services import serve_provisioner
from tests.support.sim_provisioner import DEPLOYMENT, serve_sim_provisioner

T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
FIVE_MIN = timedelta(minutes=5)


@dataclass
class Sweeper:
    clock: ManualClock
    sessions: sessionmaker[Session]
    lease: LeaderLease
    orphans: OrphanSweep
    reconcile: InventoryReconcile
    probe: MetricsProbe
    provisioner: Any

    def orphan_sweep(self) -> None:
        assert self.lease.try_acquire()
        self.orphans.run(self.clock.now(), self.lease)

    def orphans_counted(self) -> dict[tuple[str, str], float]:
        return {
            (dict(labels)["provider"], dict(labels)["outcome"]): value
            for labels, value in self.probe.series(SWEEPER_ORPHANS.name).items()
        }

    def listing_failures(self) -> dict[str, float]:
        return {
            dict(labels)["provider"]: v
            for labels, v in self.probe.series(SWEEPER_LISTING_FAILURES.name).items()
        }


@contextmanager
def sweeper(pg_url: str, clock: ManualClock, address: str, provisioner: Any) -> Iterator[Sweeper]:
    engine = make_engine(pg_url)
    sessions = make_sessionmaker(engine)
    client = ProvisionerClient(address, tls.transport("sweeper"), timeout_s=5.0)
    lease = LeaderLease("sweeper", "sweeper-under-test", clock, sessions, ttl_s=30.0)
    probe = MetricsProbe()
    orphans = OrphanSweep(
        sessions,
        client,
        clock,
        OrphanPolicy(deployment_id=DEPLOYMENT, grace=timedelta(minutes=10)),
        rounds_before_incident=3,
        instruments=probe.instruments,
    )
    reconcile = InventoryReconcile(sessions, client, instruments=probe.instruments)
    try:
        yield Sweeper(clock, sessions, lease, orphans, reconcile, probe, provisioner)
    finally:
        orphans.close()
        probe.close()
        client.close()
        engine.dispose()


@pytest.fixture
def on_sim(pg_url: str) -> Iterator[Sweeper]:
    clock = ManualClock(T0)
    with serve_sim_provisioner(clock) as sim, sweeper(pg_url, clock, sim.address, sim) as s:
        yield s


@pytest.fixture
def on_script(pg_url: str) -> Iterator[Sweeper]:
    clock = ManualClock(T0)
    with serve_provisioner() as scripted, sweeper(pg_url, clock, scripted.address, scripted) as s:
        yield s


def test_an_orphan_is_refused_while_too_young_then_found_and_destroyed_once(on_sim: Sweeper) -> None:
    sweep, sim = on_sim, on_sim.provisioner
    sim.create("m-orphan")  # no machine record: an orphan
    recorded = sim.create("m-recorded")
    add_machine(sweep.sessions, T0, id="m-recorded", provider_instance_id=recorded.provider_instance_id)

    sweep.orphan_sweep()  # T0: first seen, inside its 10-minute grace window
    sweep.clock.advance(FIVE_MIN)
    sweep.orphan_sweep()  # T0 + 5 min: still inside
    assert sweep.orphans_counted() == {("SIM", "refused"): 2}

    sweep.clock.advance(FIVE_MIN)
    sweep.orphan_sweep()  # T0 + 10 min: past it on both clocks: found, destroyed
    assert sim.instance("m-orphan") is None
    assert sweep.orphans_counted() == {("SIM", "refused"): 2, ("SIM", "found"): 1, ("SIM", "destroyed"): 1}

    sweep.clock.advance(FIVE_MIN)
    sweep.orphan_sweep()  # gone: nothing more, and the recorded machine was never counted
    assert sweep.orphans_counted() == {("SIM", "refused"): 2, ("SIM", "found"): 1, ("SIM", "destroyed"): 1}


def test_a_destroy_that_fails_is_found_once_and_destroyed_when_it_succeeds(on_sim: Sweeper) -> None:
    sweep, sim = on_sim, on_sim.provisioner
    sim.create("m-orphan")
    sweep.orphan_sweep()
    sweep.clock.advance(timedelta(minutes=10))
    sim.cloud.fail_next("destroy", Transient("throttled"))
    sweep.orphan_sweep()
    assert sweep.orphans_counted() == {("SIM", "refused"): 1, ("SIM", "found"): 1}
    sweep.clock.advance(FIVE_MIN)
    sweep.orphan_sweep()
    assert sweep.orphans_counted() == {("SIM", "refused"): 1, ("SIM", "found"): 1, ("SIM", "destroyed"): 1}


def test_another_deployments_instance_is_refused_every_round(on_script: Sweeper) -> None:
    sweep, scripted = on_script, on_script.provisioner
    scripted.instances.append(
        provisioner_service_pb2.Instance(
            provider=machine_pb2.PROVIDER_AWS,
            provider_instance_id="i-theirs",
            status=provisioner_service_pb2.INSTANCE_STATUS_RUNNING,
            labels={"gpufleet-machine": "m-theirs", "gpufleet-deployment": "someone-else"},
        )
    )
    for _ in range(2):
        sweep.orphan_sweep()
        sweep.clock.advance(FIVE_MIN)
    assert sweep.orphans_counted() == {("AWS", "refused"): 2}
    assert scripted.ops("destroy") == []


def test_failed_listings_count_up_per_provider_and_go_back_to_zero(on_sim: Sweeper) -> None:
    sweep, sim = on_sim, on_sim.provisioner
    sim.create("m-orphan")
    sweep.orphan_sweep()
    assert sweep.listing_failures() == {"SIM": 0.0}  # listed: shown, at zero

    sim.cloud.fail_next("list", Transient("compute API unavailable"), times=3)
    for rounds in (1, 2, 3):
        sweep.clock.advance(FIVE_MIN)
        sweep.orphan_sweep()
        assert sweep.listing_failures() == {"SIM": float(rounds)}

    sweep.clock.advance(FIVE_MIN)
    sweep.orphan_sweep()
    assert sweep.listing_failures() == {"SIM": 0.0}


def test_a_provisioner_that_cannot_be_reached_is_its_own_streak(on_script: Sweeper) -> None:
    sweep, scripted = on_script, on_script.provisioner
    scripted.fail_next("list", "TRANSIENT", times=2)
    for rounds in (1, 2):
        sweep.orphan_sweep()
        assert sweep.listing_failures() == {"PROVISIONER": float(rounds)}
        sweep.clock.advance(FIVE_MIN)
    sweep.orphan_sweep()
    assert sweep.listing_failures() == {"PROVISIONER": 0.0}


def test_a_replica_that_lost_the_lease_stops_reporting_its_listing_streaks(on_sim: Sweeper) -> None:
    sweep, sim = on_sim, on_sim.provisioner
    sim.cloud.fail_next("list", Transient("compute API unavailable"))
    sweep.orphan_sweep()
    assert sweep.listing_failures() == {"SIM": 1.0}

    sweep.clock.advance(timedelta(seconds=31))  # our lease lapses; another replica takes it
    other = LeaderLease("sweeper", "another-replica", sweep.clock, sweep.sessions, ttl_s=30.0)
    assert other.try_acquire()
    assert not sweep.lease.try_acquire()
    assert sweep.listing_failures() == {}  # the new leader's figures are the only ones


def test_a_preempted_machine_is_measured_from_the_last_listing_that_showed_it_running(
    on_sim: Sweeper,
) -> None:
    sweep, sim = on_sim, on_sim.provisioner
    instance = sim.create("m-spot")
    add_machine(
        sweep.sessions,
        T0,
        id="m-spot",
        provider_instance_id=instance.provider_instance_id,
        capacity_type="SPOT",
    )
    assert sweep.lease.try_acquire()
    sweep.reconcile.reconcile(T0, sweep.lease)  # listed running: provider_seen_at = T0
    assert machine(sweep.sessions, "m-spot").provider_seen_at == T0
    assert sweep.probe.points(REAPER_DETECTION_LATENCY.name) == {}

    sweep.clock.advance(timedelta(seconds=20))
    sim.cloud.preempt(instance.provider_instance_id)
    sweep.clock.advance(timedelta(seconds=40))
    assert sweep.lease.try_acquire()
    sweep.reconcile.reconcile(sweep.clock.now(), sweep.lease)  # the next reconcile, 60 s on
    assert machine(sweep.sessions, "m-spot").state == "DESTROYED"
    points = sweep.probe.points(REAPER_DETECTION_LATENCY.name)
    assert {labels: (p.count, p.sum) for labels, p in points.items()} == {
        (("net", "inventory_reconcile"),): (1, 60.0)
    }
