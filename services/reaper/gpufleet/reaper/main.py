"""Run the reaper: ``python -m gpufleet.reaper``.

It connects to the database (migrations are the migrate step's job, not the reaper's),
serves ReaperService with health and reflection, and runs its watchdogs on a Ticker in a
background thread — only while it holds the ``reaper`` leader lease, so several replicas
can run and exactly one acts. SIGTERM/SIGINT stops the loops, releases the lease (another
replica takes over at once) and stops the server gracefully.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import Clock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.grpcserver import (
    ServiceBinding,
    create_server,
)
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker
from gpufleet.common.runtime import TimerService, serve
from gpufleet.reaper.agent_probe import AgentProber, GrpcAgentProber
from gpufleet.reaper.auto_destroy import AutoDestroy
from gpufleet.reaper.auto_stop import AutoStop
from gpufleet.reaper.boot_failure import BootFailure
from gpufleet.reaper.idle_scanner import AgentSampler, GrpcAgentSampler, IdleScanner
from gpufleet.reaper.lost_detector import LostDetector
from gpufleet.reaper.provision_deadline import ProvisionDeadline
from gpufleet.reaper.service import ReaperService
from gpufleet.reaper.settings import Settings
from gpufleet.reaper.stuck_transition import StuckProvider, StuckTransition
from gpufleet.reaper.went_silent import WentSilent
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
) -> list[PeriodicTask]:
    """Every machine-level net, each its own module with its own gate and cadence.

    Five of them can destroy (auto-destroy, provision deadline, boot failure, went
    silent) or stop (auto-stop), all behind the one refusal ladder; the lost detector is
    given no provisioner at all, and stuck transition reads and re-issues only a stop or
    destroy already intended.
    """
    outcomes = settings.outcome_policy()
    idle = IdleScanner(
        sessions,
        lease,
        sampler,
        settings.idle_policy(),
        concurrency=settings.idle_sample_concurrency,
        pass_deadline_s=settings.idle_pass_deadline_s,
    )
    stop = AutoStop(sessions, lease, clock, provider, settings.auto_stop_policy())
    destroy = AutoDestroy(sessions, lease, clock, provider, settings.auto_destroy_policy())
    deadline = ProvisionDeadline(
        sessions, lease, clock, provider, settings.provision_deadline_policy(), outcomes
    )
    boot = BootFailure(
        sessions,
        lease,
        clock,
        provider,
        prober,
        settings.boot_failure_policy(),
        outcomes,
        concurrency=settings.idle_sample_concurrency,
    )
    silent = WentSilent(sessions, lease, clock, provider, settings.went_silent_policy(), outcomes)
    lost = LostDetector(sessions, lease, clock, settings.lost_policy())
    stuck = StuckTransition(sessions, lease, clock, provider, settings.stuck_policy(), outcomes)
    return [
        PeriodicTask(idle.name, settings.idle_scan_every_s, idle.run),
        PeriodicTask(stop.name, settings.auto_stop_every_s, stop.run),
        PeriodicTask(destroy.name, settings.auto_destroy_every_s, destroy.run),
        PeriodicTask(deadline.name, settings.provision_deadline_every_s, deadline.run),
        PeriodicTask(boot.name, settings.boot_failure_every_s, boot.run),
        PeriodicTask(silent.name, settings.went_silent_every_s, silent.run),
        PeriodicTask(lost.name, settings.lost_detector_every_s, lost.run),
        PeriodicTask(stuck.name, settings.stuck_transition_every_s, stuck.run),
    ]


# A running reaper is the shared timer-service runtime.
Reaper = TimerService


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
    tasks = build_watchdogs(settings, sessions, lease, clock, provider, sampler, prober)
    ticker = Ticker(SERVICE, clock, sessions, lease, tasks, renew_s=settings.lease_renew_s)
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
    return Reaper(
        name=SERVICE,
        settings=settings,
        engine=engine,
        lease=lease,
        ticker=ticker,
        server=server,
        provider=owned_provider,
    )


def main() -> int:
    settings = Settings()
    settings.start_process(SERVICE)
    return serve(build(settings), settings.port_file)
