"""``python -m gpufleet.scheduler``: JobService, WorkspaceService, CatalogService,
FleetService and WorkerService, plus the leader's fleet tick and the request-level watchdogs."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Sequence

from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import Catalog, load_catalog
from gpufleet.common.clients.agent import AgentClient
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import Clock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.outage import DatabaseWatch, describe, is_outage
from gpufleet.common.grpcserver import (
    AioServiceServer,
    Lane,
    ServiceBinding,
    announce_port,
    create_aio_server,
    run_until_signalled,
)
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker
from gpufleet.common.runtime import Closable, TimerService, serve
from gpufleet.common.trust.transport import Transport
from gpufleet.scheduler.api_processes import API_ONLY_FLAG, ApiProcesses, die_with_parent
from gpufleet.scheduler.catalog_service import CatalogService
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.fleet_service import FleetService
from gpufleet.scheduler.job_service import JobService
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.fleet import FleetTick
from gpufleet.scheduler.tick.served import ServedOfferings
from gpufleet.scheduler.token_service import TokenService
from gpufleet.scheduler.watchdogs.no_consumer import NAME as NO_CONSUMER
from gpufleet.scheduler.watchdogs.no_consumer import NoConsumerDetector
from gpufleet.scheduler.watchdogs.paid_wait import NAME as PAID_WAIT
from gpufleet.scheduler.watchdogs.paid_wait import PaidWaitIncident
from gpufleet.scheduler.watchdogs.pool_idle import NAME as POOL_IDLE
from gpufleet.scheduler.watchdogs.pool_idle import PoolIdleRelease
from gpufleet.scheduler.watchdogs.queue_wait import NAME as QUEUE_WAIT
from gpufleet.scheduler.watchdogs.queue_wait import QueueWaitTimeout
from gpufleet.scheduler.watchdogs.stuck_dispatch import NAME as STUCK_DISPATCH
from gpufleet.scheduler.watchdogs.stuck_dispatch import StuckDispatchReset
from gpufleet.scheduler.worker_service import WorkerService
from gpufleet.scheduler.workspace_service import WorkspaceService
from gpufleet.v1 import (
    catalog_service_pb2,
    catalog_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    job_service_pb2,
    job_service_pb2_grpc,
    token_service_pb2,
    token_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
    workspace_service_pb2,
    workspace_service_pb2_grpc,
)

SERVICE = "scheduler"
WORKER_SERVICE = worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name
log = logging.getLogger("gpufleet.scheduler")


def _server(
    settings: Settings, sessions: sessionmaker[Session], clock: Clock, jobs: JobService, transport: Transport
) -> AioServiceServer:
    """The API: JobService, FleetService and WorkerService on an asyncio server. WatchJob
    streams wait on its loop and hold no thread; the workers' reports run on a lane of
    their own that no other caller can fill."""
    return create_aio_server(
        settings.listen_address,
        [
            ServiceBinding(
                job_service_pb2_grpc.add_JobServiceServicer_to_server,
                jobs,
                job_service_pb2.DESCRIPTOR.services_by_name["JobService"].full_name,
            ),
            ServiceBinding(
                fleet_service_pb2_grpc.add_FleetServiceServicer_to_server,
                FleetService(sessions, clock),
                fleet_service_pb2.DESCRIPTOR.services_by_name["FleetService"].full_name,
            ),
            ServiceBinding(
                catalog_service_pb2_grpc.add_CatalogServiceServicer_to_server,
                CatalogService(sessions),
                catalog_service_pb2.DESCRIPTOR.services_by_name["CatalogService"].full_name,
            ),
            ServiceBinding(
                workspace_service_pb2_grpc.add_WorkspaceServiceServicer_to_server,
                WorkspaceService(sessions, clock),
                workspace_service_pb2.DESCRIPTOR.services_by_name["WorkspaceService"].full_name,
            ),
            ServiceBinding(
                token_service_pb2_grpc.add_TokenServiceServicer_to_server,
                TokenService(sessions, clock),
                token_service_pb2.DESCRIPTOR.services_by_name["TokenService"].full_name,
            ),
            ServiceBinding(
                worker_service_pb2_grpc.add_WorkerServiceServicer_to_server,
                WorkerService(sessions, clock, settings),
                worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
            ),
        ],
        max_workers=settings.api_workers,
        lanes=[Lane(WORKER_SERVICE, settings.worker_lane_workers)],
        reuse_port=settings.api_processes > 1 or settings.api_only,
        transport=transport,
        # The extra API processes share the main port; only the first answers the probe port.
        health_address=None if settings.api_only else settings.health_listen_address,
    )


def _sync_catalog(sessions: sessionmaker[Session], catalog: Catalog) -> bool:
    """Write the catalogue file into the store; False when the database is unavailable."""
    for _ in range(5):  # replicas starting together may race on the first insert
        try:
            with sessions() as session, session.begin():
                sync_catalog(session, catalog)
            return True
        except (IntegrityError, OperationalError) as exc:
            if is_outage(exc):
                log.warning("catalogue not synced: the database is unavailable (%s)", describe(exc))
                return False
            log.info("catalogue sync raced another replica; retrying")
    return True


def build(settings: Settings) -> TimerService:
    """Wire the scheduler: its three gRPC services, the leader's fleet tick, and the extra
    API processes it is configured with."""
    clock = settings.make_clock()
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    watch = DatabaseWatch(engine, clock)
    catalog = load_catalog(settings.catalog_file)
    if not _sync_catalog(sessions, catalog):
        # Started while the database is away: it answers UNAVAILABLE meanwhile, and the
        # catalogue is synced as soon as the database answers.
        def sync_when_back(up: bool) -> None:
            if up:
                _sync_catalog(sessions, catalog)

        watch.on_change(sync_when_back)
    transport = settings.transport(SERVICE)
    provisioner = ProvisionerClient(
        settings.provisioner_address,
        transport,
        timeout_s=max(settings.provider_call_timeout_s, settings.rpc_timeout_s),
    )
    lease = LeaderLease(SERVICE, settings.instance_name, clock, sessions, settings.lease_ttl_s)
    served = ServedOfferings()
    tick = FleetTick(
        sessions,
        clock,
        lease,
        provisioner,
        settings,
        agent_factory=lambda machine_id, address: AgentClient(machine_id, address, transport),
        served=served,
    )
    # Its own client with a short deadline: reading the offerings is quick, and the ticker
    # that runs the fleet tick must not wait out a provider call's long one on it.
    offerings_client = ProvisionerClient(
        settings.provisioner_address, transport, timeout_s=settings.rpc_timeout_s / 2
    )
    no_consumer = NoConsumerDetector(sessions, lease, offerings_client, served, settings.max_running_machines)
    ticker = Ticker(
        SERVICE,
        clock,
        sessions,
        lease,
        [
            # First: what the provisioner serves is known before the first tick scales.
            PeriodicTask(NO_CONSUMER, settings.no_consumer_every_s, no_consumer.run),
            PeriodicTask("fleet_tick", settings.tick_s, tick.run),
            PeriodicTask(QUEUE_WAIT, settings.queue_wait_every_s, QueueWaitTimeout(sessions, lease).run),
            PeriodicTask(
                STUCK_DISPATCH,
                settings.stuck_dispatch_every_s,
                StuckDispatchReset(sessions, lease, settings.stuck_dispatch_policy()).run,
            ),
            PeriodicTask(
                PAID_WAIT,
                settings.paid_wait_every_s,
                PaidWaitIncident(sessions, lease, settings.paid_wait_policy()).run,
            ),
            PeriodicTask(POOL_IDLE, settings.pool_idle_every_s, PoolIdleRelease(sessions, lease).run),
        ],
        settings.lease_renew_s,
        watch=watch,
        settle_s=settings.outage_settle_s,
    )
    jobs = JobService(sessions, clock, transport)
    server = _server(settings, sessions, clock, jobs, transport)
    watch.on_change(server.set_serving)
    watch.start()
    others: list[Closable] = [tick, jobs, offerings_client, watch]
    if settings.api_processes > 1:
        host = settings.listen_address.rsplit(":", 1)[0]
        extra = ApiProcesses(settings.api_processes - 1, host, server.port)
        try:
            extra.start()
        except BaseException:
            server.stop(0)
            raise
        others.insert(0, extra)
    return TimerService(
        name=SERVICE,
        settings=settings,
        engine=engine,
        lease=lease,
        ticker=ticker,
        server=server,
        provider=provisioner,
        others=tuple(others),
    )


def serve_api_only(settings: Settings) -> int:
    """One of the extra API processes: the API and nothing else (no lease, no tick, no
    catalogue sync), until SIGTERM or the scheduler that started it dies."""
    if not die_with_parent():
        log.warning("the scheduler that started this API process is gone; not serving")
        return 0
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    clock = settings.make_clock()
    transport = settings.transport(SERVICE)
    jobs = JobService(sessions, clock, transport)
    server = _server(settings, sessions, clock, jobs, transport)
    watch = DatabaseWatch(engine, clock)
    watch.on_change(server.set_serving)
    watch.start()
    announce_port(server.port, settings.port_file)
    try:
        run_until_signalled(server, threading.Event())
    finally:
        watch.close()
        jobs.close()
        engine.dispose()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    unknown = [a for a in args if a != API_ONLY_FLAG]
    if unknown:
        print(
            f"usage: python -m gpufleet.scheduler [{API_ONLY_FLAG}]; unknown: {' '.join(unknown)}",
            file=sys.stderr,
        )
        return 2
    settings = Settings(api_only=API_ONLY_FLAG in args)
    # An extra API process inherits the first one's environment, its metrics address too:
    # only the first serves metrics (the extras' SubmitJob counts are not scraped).
    settings.start_process(SERVICE, serve_metrics=not settings.api_only)
    if settings.api_only:
        return serve_api_only(settings)
    return serve(build(settings), settings.port_file)


if __name__ == "__main__":
    raise SystemExit(main())
