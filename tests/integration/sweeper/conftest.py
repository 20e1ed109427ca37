"""A sweeper wired as ``main.build`` wires it, on a manual clock, against a scripted
provisioner served over real gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker
from gpufleet.sweeper.inventory_reconcile import InventoryReconcile
from gpufleet.sweeper.main import TimedReconcile
from tests.support.scripted_services import ScriptedProvisioner, serve_provisioner


@dataclass
class Sweep:
    clock: ManualClock
    sessions: sessionmaker[Session]
    lease: LeaderLease
    ticker: Ticker
    reconcile: InventoryReconcile
    provisioner: ScriptedProvisioner

    def tick(self) -> None:
        self.lease.try_acquire()
        self.ticker.run_due()

    def step(self, seconds: float = 60.0) -> None:
        self.clock.advance(timedelta(seconds=seconds))
        self.tick()


@pytest.fixture
def sweep(db_url: str) -> Iterator[Sweep]:
    clock = ManualClock()
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    with serve_provisioner() as provisioner:
        client = ProvisionerClient(provisioner.address, timeout_s=5.0)
        lease = LeaderLease("sweeper", "test-sweeper", clock, sessions, ttl_s=15)
        reconcile = InventoryReconcile(sessions, client)
        timed = TimedReconcile(reconcile, sessions, lease, clock)
        ticker = Ticker(
            "sweeper", clock, sessions, lease, [PeriodicTask(reconcile.name, 60.0, timed.run)], renew_s=5
        )
        yield Sweep(clock, sessions, lease, ticker, reconcile, provisioner)
        client.close()
    engine.dispose()
