"""The life of a timer-driven service process (scheduler, reaper, sweeper): one gRPC
server, one leader's Ticker thread, and an orderly stop — loops first (releasing the
lease so another replica takes over at once), then the server, then connections."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Protocol

from sqlalchemy import Engine

from gpufleet.common.grpcserver import AioServiceServer, ServiceServer, announce_port, run_until_signalled
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import Ticker
from gpufleet.common.settings import BaseServiceSettings

log = logging.getLogger(__name__)


class Closable(Protocol):
    """Anything with a ``close()`` the service owns (e.g. a ProvisionerClient)."""

    def close(self) -> None: ...


@dataclass
class TimerService:
    """A running timer-driven service: its server, its ticker thread and what they hold."""

    name: str
    settings: BaseServiceSettings
    engine: Engine
    lease: LeaderLease
    ticker: Ticker
    server: ServiceServer | AioServiceServer
    # Clients this service opened itself (not ones a test passed in): closed on stop.
    provider: Closable | None = None
    # What else it owns and closes after the loops stop (the fleet tick's call pool).
    others: tuple[Closable, ...] = ()
    stop_event: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start_loops(self) -> None:
        self.thread = threading.Thread(
            target=self.ticker.run_forever, args=(self.stop_event,), name=f"{self.name}-ticker", daemon=True
        )
        self.thread.start()

    def close(self, grace: float = 5.0) -> None:
        """Stop the loops (releasing the lease), then the server, then the connections."""
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=grace + 30)
        self.server.stop(grace)
        for other in self.others:
            other.close()
        if self.provider is not None:
            self.provider.close()
        self.engine.dispose()


def serve(service: TimerService, port_file: str | None) -> int:
    """Announce the port, run the loops and serve until SIGTERM/SIGINT; exit status 0."""
    log.info(
        "%s serving on port %d",
        service.name,
        service.server.port,
        extra={
            "fields": {
                "port": service.server.port,
                "instance": getattr(service.settings, "instance_name", ""),
            }
        },
    )
    announce_port(service.server.port, port_file)
    service.start_loops()
    try:
        run_until_signalled(service.server, service.stop_event)
    finally:
        service.close()
    log.info("%s stopped", service.name)
    return 0


def _instance(service: TimerService) -> str:
    return str(getattr(service.settings, "instance_name", ""))
