"""``python -m gpufleet.scheduler``: JobService, FleetService and WorkerService, plus the
leader's fleet tick."""

from __future__ import annotations

import logging

from sqlalchemy.exc import IntegrityError, OperationalError

from gpufleet.common import telemetry
from gpufleet.common.catalog import load_catalog
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.grpcserver import Lane, ServiceBinding, create_aio_server
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker
from gpufleet.common.runtime import TimerService, serve
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.fleet_service import FleetService
from gpufleet.scheduler.job_service import JobService
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.fleet import FleetTick
from gpufleet.scheduler.worker_service import WorkerService
from gpufleet.v1 import (
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    job_service_pb2,
    job_service_pb2_grpc,
    worker_service_pb2,
    worker_service_pb2_grpc,
)

SERVICE = "scheduler"
WORKER_SERVICE = worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name
log = logging.getLogger("gpufleet.scheduler")


def build(settings: Settings) -> TimerService:
    """Wire the scheduler: its three gRPC services and the leader's fleet tick."""
    clock = settings.make_clock()
    engine = make_engine(settings.database_url)
    sessions = make_sessionmaker(engine)
    catalog = load_catalog(settings.catalog_file)
    for _ in range(5):  # replicas starting together may race on the first insert
        try:
            with sessions() as session, session.begin():
                sync_catalog(session, catalog)
            break
        except (IntegrityError, OperationalError):
            log.info("catalogue sync raced another replica; retrying")
    provisioner = ProvisionerClient(
        settings.provisioner_address, timeout_s=max(settings.provider_call_timeout_s, settings.rpc_timeout_s)
    )
    lease = LeaderLease(SERVICE, settings.instance_name, clock, sessions, settings.lease_ttl_s)
    tick = FleetTick(sessions, clock, lease, provisioner, settings)
    ticker = Ticker(
        SERVICE,
        clock,
        sessions,
        lease,
        [PeriodicTask("fleet_tick", settings.tick_s, tick.run)],
        settings.lease_renew_s,
    )
    jobs = JobService(sessions, clock)
    # An asyncio server: WatchJob streams wait on its loop and hold no thread; the workers'
    # reports run on a lane of their own that no other caller can fill.
    server = create_aio_server(
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
                worker_service_pb2_grpc.add_WorkerServiceServicer_to_server,
                WorkerService(sessions, clock, settings),
                worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
            ),
        ],
        max_workers=settings.api_workers,
        lanes=[Lane(WORKER_SERVICE, settings.worker_lane_workers)],
    )
    return TimerService(
        name=SERVICE,
        settings=settings,
        engine=engine,
        lease=lease,
        ticker=ticker,
        server=server,
        provider=provisioner,
        others=(tick, jobs),
    )


def main() -> int:
    settings = Settings()
    telemetry.configure(
        SERVICE,
        otlp_endpoint=settings.otlp_endpoint,
        level=settings.log_level,
        log_format=settings.log_format,
    )
    return serve(build(settings), settings.port_file)


if __name__ == "__main__":
    raise SystemExit(main())
