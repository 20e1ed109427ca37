"""Run the sweeper: ``python -m gpufleet.sweeper``.

It connects to the database (migrations are the migrate step's job), serves
SweeperService with health and reflection, and runs its passes on a Ticker in a
background thread while it holds the ``sweeper`` leader lease. SIGTERM/SIGINT stops the
loop, releases the lease and stops the server gracefully.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import telemetry
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import Clock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.grpcserver import (
    ServiceBinding,
    ServiceServer,
    announce_port,
    create_server,
    run_until_signalled,
)
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker, TickReport
from gpufleet.sweeper import sweeps
from gpufleet.sweeper.inventory_reconcile import InstanceLister, InventoryReconcile
from gpufleet.sweeper.service import SweeperService
from gpufleet.sweeper.settings import Settings
from gpufleet.v1 import sweeper_service_pb2, sweeper_service_pb2_grpc

log = logging.getLogger(__name__)

SERVICE = "sweeper"


class TimedReconcile:
    """The leader's reconcile: fenced, and recorded as a sweep for ListSweeps."""

    def __init__(
        self, reconcile: InventoryReconcile, sessions: sessionmaker[Session], lease: LeaderLease, clock: Clock
    ) -> None:
        self.reconcile = reconcile
        self.sessions = sessions
        self.lease = lease
        self.clock = clock

    def run(self, now: datetime) -> TickReport:
        result = self.reconcile.reconcile(now, lease=self.lease)
        sweeps.record(self.sessions, sweeps.INVENTORY_RECONCILE, result, self.clock.now())
        return result.report


@dataclass
class Sweeper:
    settings: Settings
    engine: Engine
    lease: LeaderLease
    ticker: Ticker
    server: ServiceServer
    provider: ProvisionerClient | None
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start_loops(self) -> None:
        self.thread = threading.Thread(
            target=self.ticker.run_forever, args=(self.stop_event,), name="sweeper-ticker", daemon=True
        )
        self.thread.start()

    def close(self, grace: float = 5.0) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=grace + 30)
        self.server.stop(grace)
        if self.provider is not None:
            self.provider.close()
        self.engine.dispose()


def build(
    settings: Settings, *, clock: Clock | None = None, provider: InstanceLister | None = None
) -> Sweeper:
    """Wire a sweeper from its settings; tests pass their own clock or provider."""
    clock = clock or settings.make_clock()
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    owned = None
    if provider is None:
        owned = ProvisionerClient(settings.provisioner_address, timeout_s=settings.provider_timeout_s)
        provider = owned
    lease = LeaderLease(SERVICE, settings.instance_name, clock, sessions, ttl_s=settings.lease_ttl_s)
    reconcile = InventoryReconcile(sessions, provider)
    timed = TimedReconcile(reconcile, sessions, lease, clock)
    ticker = Ticker(
        SERVICE,
        clock,
        sessions,
        lease,
        [PeriodicTask(reconcile.name, settings.inventory_reconcile_every_s, timed.run)],
        renew_s=settings.lease_renew_s,
    )
    server = create_server(
        settings.listen_address,
        [
            ServiceBinding(
                sweeper_service_pb2_grpc.add_SweeperServiceServicer_to_server,
                SweeperService(sessions, clock, reconcile),
                sweeper_service_pb2.DESCRIPTOR.services_by_name["SweeperService"].full_name,
            )
        ],
    )
    return Sweeper(
        settings=settings, engine=engine, lease=lease, ticker=ticker, server=server, provider=owned
    )


def main() -> int:
    settings = Settings()
    telemetry.configure(
        SERVICE,
        otlp_endpoint=settings.otlp_endpoint,
        level=settings.log_level,
        log_format=settings.log_format,
    )
    sweeper = build(settings)
    log.info(
        "sweeper serving on port %d",
        sweeper.server.port,
        extra={"fields": {"port": sweeper.server.port, "instance": settings.instance_name}},
    )
    announce_port(sweeper.server.port, settings.port_file)
    sweeper.start_loops()
    try:
        run_until_signalled(sweeper.server, sweeper.stop_event)
    finally:
        sweeper.close()
    log.info("sweeper stopped")
    return 0
