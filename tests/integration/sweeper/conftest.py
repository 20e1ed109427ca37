"""A sweeper wired as ``main.build`` wires it — real store, real gRPC client, real Ticker
and leader lease, both passes at their cadences — on a manual clock the test advances,
against a provisioner served on 127.0.0.1 port 0: scripted (``sweep``), or the real
ProvisionerService with its sim driver (``sim_sweep``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import Failure, Incident, Orphan
from gpufleet.common.db.models import Sweep as SweepRow
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import Ticker
from gpufleet.sweeper.inventory_reconcile import InventoryReconcile
from gpufleet.sweeper.main import TimedPasses
from gpufleet.sweeper.orphan_sweep import OrphanSweep
from gpufleet.sweeper.settings import Settings
from tests.support import tls
from tests.support.scripted_services import serve_provisioner
from tests.support.sim_provisioner import DEPLOYMENT, serve_sim_provisioner


@dataclass
class Sweep:
    clock: ManualClock
    sessions: sessionmaker[Session]
    lease: LeaderLease
    ticker: Ticker
    reconcile: InventoryReconcile
    orphans: OrphanSweep
    passes: TimedPasses
    # A ScriptedProvisioner, or a SimProvisioner (the real service with its sim driver).
    provisioner: Any

    def tick(self) -> None:
        """One pass of the loop: renew the lease, run every pass that is due."""
        self.lease.try_acquire()
        self.ticker.run_due()

    def step(self, seconds: float = 60.0) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        self.tick()

    def run_orphan_sweep(self) -> None:
        """One orphan sweep now, as the leader's Ticker runs it (fenced, recorded)."""
        assert self.lease.try_acquire()
        self.passes.run_orphan_sweep(self.clock.now())

    def failures(self, failure_class: str | None = None) -> list[Failure]:
        with self.sessions() as s:
            query = select(Failure).order_by(Failure.id)
            if failure_class is not None:
                query = query.where(Failure.failure_class == failure_class)
            return list(s.execute(query).scalars())

    def incidents(self) -> list[Incident]:
        with self.sessions() as s:
            return list(s.execute(select(Incident).order_by(Incident.id)).scalars())

    def orphan_rows(self) -> dict[str, Orphan]:
        """Orphan rows by machine label (or provider instance id when unlabelled)."""
        with self.sessions() as s:
            rows = s.execute(select(Orphan).order_by(Orphan.id)).scalars()
            return {r.machine_label or r.provider_instance_id: r for r in rows}

    def sweep_rows(self, kind: str) -> list[SweepRow]:
        with self.sessions() as s:
            return list(
                s.execute(select(SweepRow).where(SweepRow.kind == kind).order_by(SweepRow.id)).scalars()
            )


@contextmanager
def wire_sweeper(
    db_url: str, clock: ManualClock, provisioner_address: str, provisioner: Any, **settings: Any
) -> Iterator[Sweep]:
    config = Settings(database_url=db_url, instance_name="test-sweeper", deployment_id=DEPLOYMENT, **settings)
    # The sweeper's own calls go as the sweeper (the tests' CA; DEPLOYMENT labels the instances).
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    client = ProvisionerClient(provisioner_address, tls.transport("sweeper"), timeout_s=5.0)
    lease = LeaderLease("sweeper", config.instance_name, clock, sessions, ttl_s=config.lease_ttl_s)
    reconcile = InventoryReconcile(sessions, client, outcomes=config.outcome_policy())
    orphans = OrphanSweep(
        sessions,
        client,
        clock,
        config.orphan_policy(),
        rounds_before_incident=config.unlisted_rounds_before_incident,
    )
    passes = TimedPasses(reconcile, orphans, sessions, lease, clock)
    ticker = Ticker("sweeper", clock, sessions, lease, passes.tasks(config), renew_s=config.lease_renew_s)
    try:
        yield Sweep(clock, sessions, lease, ticker, reconcile, orphans, passes, provisioner)
    finally:
        client.close()
        engine.dispose()


@pytest.fixture
def sweep(db_url: str) -> Iterator[Sweep]:
    """The sweeper against a scripted provisioner (call-by-call assertions, scripted failures)."""
    clock = ManualClock()
    with (
        serve_provisioner() as provisioner,
        wire_sweeper(db_url, clock, provisioner.address, provisioner) as s,
    ):
        yield s


@pytest.fixture
def sim_sweep(db_url: str) -> Iterator[Sweep]:
    """The sweeper against the real ProvisionerService and its sim cloud, on the same clock."""
    clock = ManualClock()
    with serve_sim_provisioner(clock) as sim, wire_sweeper(db_url, clock, sim.address, sim) as s:
        yield s
