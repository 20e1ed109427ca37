"""Run the sweeper: ``python -m gpufleet.sweeper``.

It connects to the database (migrations are the migrate step's job), serves
SweeperService with health and reflection, and runs its passes — the inventory
reconcile and the orphan sweep, each at its own cadence — on a Ticker in a background
thread while it holds the ``sweeper`` leader lease. SIGTERM/SIGINT stops the
loop, releases the lease and stops the server gracefully.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import Clock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.outage import DatabaseWatch
from gpufleet.common.grpcserver import (
    ServiceBinding,
    create_server,
)
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker, TickReport
from gpufleet.common.runtime import TimerService, serve
from gpufleet.sweeper import sweeps
from gpufleet.sweeper.inventory_reconcile import InventoryReconcile
from gpufleet.sweeper.listing import Provisioner
from gpufleet.sweeper.nets import SWEEPER_NETS
from gpufleet.sweeper.orphan_sweep import OrphanSweep
from gpufleet.sweeper.service import SweeperService
from gpufleet.sweeper.settings import Settings
from gpufleet.v1 import sweeper_service_pb2, sweeper_service_pb2_grpc

log = logging.getLogger(__name__)

SERVICE = "sweeper"


class TimedPasses:
    """The leader's passes as the Ticker runs them: fenced, and each recorded as a sweep
    for ListSweeps."""

    def __init__(
        self,
        reconcile: InventoryReconcile,
        orphans: OrphanSweep,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        clock: Clock,
    ) -> None:
        self.reconcile = reconcile
        self.orphans = orphans
        self.sessions = sessions
        self.lease = lease
        self.clock = clock

    def run_reconcile(self, now: datetime) -> TickReport:
        result = self.reconcile.reconcile(now, lease=self.lease)
        sweeps.record(self.sessions, sweeps.INVENTORY_RECONCILE, result, self.clock.now())
        return result.report

    def run_orphan_sweep(self, now: datetime) -> TickReport:
        result = self.orphans.run(now, self.lease)
        sweeps.record(self.sessions, sweeps.ORPHAN_SWEEP, result, self.clock.now())
        return result.report

    def tasks(self, settings: Settings) -> list[PeriodicTask]:
        """Each pass at its own cadence (DESIGN §4: reconcile 60 s, orphan sweep 5 min), in
        the order of the net registry (:mod:`gpufleet.sweeper.nets`)."""
        return [PeriodicTask(net.name, net.every(settings), net.run(self)) for net in SWEEPER_NETS]


# A running sweeper is the shared timer-service runtime.
Sweeper = TimerService


def build_passes(
    settings: Settings,
    sessions: sessionmaker[Session],
    provider: Provisioner,
    lease: LeaderLease,
    clock: Clock,
) -> TimedPasses:
    """The inventory reconcile and the orphan sweep as the settings make them, under
    ``lease`` (also what a test that runs the sweeper in process builds)."""
    reconcile = InventoryReconcile(
        sessions,
        provider,
        outcomes=settings.outcome_policy(),
        not_listed_grace=timedelta(seconds=settings.not_listed_grace_s),
    )
    orphans = OrphanSweep(
        sessions,
        provider,
        clock,
        settings.orphan_policy(),
        rounds_before_incident=settings.unlisted_rounds_before_incident,
    )
    return TimedPasses(reconcile, orphans, sessions, lease, clock)


def build(settings: Settings, *, clock: Clock | None = None, provider: Provisioner | None = None) -> Sweeper:
    """Wire a sweeper from its settings; tests pass their own clock or provider."""
    clock = clock or settings.make_clock()
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    transport = settings.transport(SERVICE)
    owned = None
    if provider is None:
        owned = ProvisionerClient(
            settings.provisioner_address, transport, timeout_s=settings.provider_timeout_s
        )
        provider = owned
    lease = LeaderLease(SERVICE, settings.instance_name, clock, sessions, ttl_s=settings.lease_ttl_s)
    passes = build_passes(settings, sessions, provider, lease, clock)
    reconcile, orphans = passes.reconcile, passes.orphans
    watch = DatabaseWatch(engine, clock)
    ticker = Ticker(
        SERVICE,
        clock,
        sessions,
        lease,
        passes.tasks(settings),
        renew_s=settings.lease_renew_s,
        watch=watch,
        settle_s=settings.outage_settle_s,
    )
    server = create_server(
        settings.listen_address,
        [
            ServiceBinding(
                sweeper_service_pb2_grpc.add_SweeperServiceServicer_to_server,
                SweeperService(sessions, clock, reconcile, orphans, lease),
                sweeper_service_pb2.DESCRIPTOR.services_by_name["SweeperService"].full_name,
            )
        ],
        transport=transport,
        health_address=settings.health_listen_address,
    )
    watch.on_change(server.set_serving)
    watch.start()
    return Sweeper(
        name=SERVICE,
        settings=settings,
        engine=engine,
        lease=lease,
        ticker=ticker,
        server=server,
        provider=owned,
        others=(orphans, watch),
    )


def main() -> int:
    settings = Settings()
    settings.start_process(SERVICE, serve_metrics=True)
    return serve(build(settings), settings.port_file)
