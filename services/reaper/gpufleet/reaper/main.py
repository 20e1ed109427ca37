"""Run the reaper: ``python -m gpufleet.reaper``.

It connects to the database (migrations are the migrate step's job, not the reaper's),
serves ReaperService with health and reflection, and runs its watchdogs on a Ticker in a
background thread — only while it holds the ``reaper`` leader lease, so several replicas
can run and exactly one acts. The nets' stops and destroys run in one bounded pool of
their own (``provider_call_workers``), so the Ticker's thread never waits on a provider.
The leader also reports the database's state as gauges (incidents open, quarantines,
every service's watchdogs: :mod:`~gpufleet.reaper.fleet_state_gauges`) and, when
``GPUFLEET_INCIDENT_WEBHOOK_URL`` is set, posts incidents opened and resolved
(:mod:`~gpufleet.reaper.incident_notifier`), each on threads of their own.
SIGTERM/SIGINT first stops those (the webhook's cursor written while the lease is held),
lets the calls in flight answer (``provider_call_drain_s``, while the lease is still held,
so their outcomes are written), then stops the loops, releases the lease (another replica
takes over at once) and stops the server gracefully.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import Clock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.outage import DatabaseWatch
from gpufleet.common.grpcserver import (
    ServiceBinding,
    create_server,
)
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker
from gpufleet.common.runtime import TimerService, serve
from gpufleet.reaper import incident_notifier
from gpufleet.reaper.agent_probe import AgentProber, GrpcAgentProber
from gpufleet.reaper.fleet_state_gauges import FleetStateGauges
from gpufleet.reaper.idle_scanner import AgentSampler, GrpcAgentSampler
from gpufleet.reaper.incident_notifier import IncidentNotifier
from gpufleet.reaper.incident_webhook import WebhookSender
from gpufleet.reaper.nets import REAPER_NETS, Wiring
from gpufleet.reaper.service import ReaperService
from gpufleet.reaper.settings import Settings
from gpufleet.reaper.stuck_transition import StuckProvider
from gpufleet.v1 import reaper_service_pb2, reaper_service_pb2_grpc

log = logging.getLogger(__name__)

SERVICE = "reaper"


# Every provisioner call the reaper makes: stop, destroy, and a fresh read (the stuck
# transition net needs all three, so its protocol is the reaper's).
ReaperProvisioner = StuckProvider


def build_watchdogs(
    settings: Settings,
    sessions: sessionmaker[Session],
    lease: LeaderLease,
    clock: Clock,
    provider: ReaperProvisioner,
    sampler: AgentSampler,
    prober: AgentProber,
    *,
    calls: CallPool,
) -> list[PeriodicTask]:
    """Every machine-level net, each its own module with its own gate and cadence, in the
    order of the net registry (:mod:`gpufleet.reaper.nets`, :mod:`gpufleet.common.nets`).

    Six of them can destroy (auto-destroy, provision deadline, boot failure, went
    silent, GPU fault) or stop (auto-stop), all behind the one refusal ladder; the lost detector is
    given no provisioner at all, and stuck transition reads and re-issues only a stop or
    destroy already intended. Every stop and destroy, re-issues included, runs in
    ``calls``: one pool, so its size bounds them all and the stuck-transition net sees
    every call still in flight.
    """
    wiring = Wiring(settings, sessions, lease, clock, provider, sampler, prober, calls)
    return [PeriodicTask(net.name, net.every(settings), net.build(wiring).run) for net in REAPER_NETS]


class SideLoop(Protocol):
    """A loop of the leader's beside the nets, on a thread of its own."""

    def start(self) -> None: ...

    def close(self) -> None: ...


@dataclass
class Reaper(TimerService):
    """A running reaper: the shared timer-service runtime, its provider-call pool, and its
    side loops (the state gauges, the incident webhook)."""

    calls: CallPool | None = None
    drain_s: float = 0.0
    side_loops: tuple[SideLoop, ...] = ()

    def start_loops(self) -> None:
        super().start_loops()
        for loop in self.side_loops:
            loop.start()

    def close(self, grace: float = 5.0) -> None:
        # While this replica still leads: the webhook's last cursor is written under its lease.
        for loop in self.side_loops:
            loop.close()
        # While this replica still leads: no new claims, and the calls in flight answer and
        # record their outcomes under its lease (after release they would be fenced).
        if self.calls is not None and not self.calls.drain(self.drain_s):
            log.warning(
                "%d provider calls still out after %.0f s; their machines stay transitional",
                self.calls.pending(),
                self.drain_s,
            )
        super().close(grace)


def build(
    settings: Settings,
    *,
    clock: Clock | None = None,
    provider: ReaperProvisioner | None = None,
    sampler: AgentSampler | None = None,
    prober: AgentProber | None = None,
) -> Reaper:
    """Wire a reaper from its settings; tests pass their own clock, provider, sampler or prober."""
    clock = clock or settings.make_clock()
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    transport = settings.transport(SERVICE)
    owned_provider = None
    if provider is None:
        owned_provider = ProvisionerClient(
            settings.provisioner_address, transport, timeout_s=settings.provider_timeout_s
        )
        provider = owned_provider
    sampler = sampler or GrpcAgentSampler(
        transport, window=timedelta(seconds=settings.idle_sample_window_s), timeout_s=settings.agent_timeout_s
    )
    prober = prober or GrpcAgentProber(transport, timeout_s=settings.agent_timeout_s)
    lease = LeaderLease(SERVICE, settings.instance_name, clock, sessions, ttl_s=settings.lease_ttl_s)
    calls = CallPool(settings.provider_call_workers, "provider-calls")
    tasks = build_watchdogs(settings, sessions, lease, clock, provider, sampler, prober, calls=calls)
    watch = DatabaseWatch(engine, clock)
    ticker = Ticker(
        SERVICE,
        clock,
        sessions,
        lease,
        tasks,
        renew_s=settings.lease_renew_s,
        watch=watch,
        settle_s=settings.outage_settle_s,
    )
    side_loops: list[SideLoop] = [FleetStateGauges(sessions, clock, lease, settings.state_metrics_every_s)]
    webhook = settings.incident_webhook()
    if webhook is None:
        incident_notifier.retire(sessions)
    else:
        post, look = webhook
        side_loops.append(IncidentNotifier(sessions, clock, lease, WebhookSender(post), look))
    server = create_server(
        settings.listen_address,
        [
            ServiceBinding(
                reaper_service_pb2_grpc.add_ReaperServiceServicer_to_server,
                ReaperService(sessions, clock),
                reaper_service_pb2.DESCRIPTOR.services_by_name["ReaperService"].full_name,
            )
        ],
        transport=transport,
        health_address=settings.health_listen_address,
    )
    watch.on_change(server.set_serving)
    watch.start()
    return Reaper(
        name=SERVICE,
        settings=settings,
        engine=engine,
        lease=lease,
        ticker=ticker,
        server=server,
        provider=owned_provider,
        others=(calls, watch),
        calls=calls,
        drain_s=settings.provider_call_drain_s,
        side_loops=tuple(side_loops),
    )


def main() -> int:
    settings = Settings()
    settings.start_process(SERVICE, serve_metrics=True)
    return serve(build(settings), settings.port_file)
