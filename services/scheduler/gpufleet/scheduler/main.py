"""``python -m gpufleet.scheduler``: JobService, FleetService and WorkerService, plus the
leader's fleet tick."""

from __future__ import annotations

import logging
import threading

from sqlalchemy.exc import IntegrityError, OperationalError

from gpufleet.common import telemetry
from gpufleet.common.catalog import load_catalog
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.grpcserver import ServiceBinding, announce_port, create_server, run_until_signalled
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker
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

log = logging.getLogger("gpufleet.scheduler")


def main() -> None:
    settings = Settings()
    telemetry.configure(
        "scheduler",
        otlp_endpoint=settings.otlp_endpoint,
        level=settings.log_level,
        log_format=settings.log_format,
    )
    clock = settings.make_clock()
    sessions = make_sessionmaker(make_engine(settings.database_url))
    catalog = load_catalog(settings.catalog_file)
    for _ in range(5):  # replicas starting together may race on the first insert
        try:
            with sessions() as session, session.begin():
                sync_catalog(session, catalog)
            break
        except (IntegrityError, OperationalError):
            log.info("catalogue sync raced another replica; retrying")
    provisioner = ProvisionerClient(settings.provisioner_address, timeout_s=max(30.0, settings.rpc_timeout_s))
    lease = LeaderLease("scheduler", settings.instance_name, clock, sessions, settings.lease_ttl_s)
    tick = FleetTick(sessions, clock, lease, provisioner, settings)
    ticker = Ticker(
        "scheduler",
        clock,
        sessions,
        lease,
        [PeriodicTask("fleet_tick", settings.tick_s, tick.run)],
        settings.lease_renew_s,
    )
    server = create_server(
        settings.listen_address,
        [
            ServiceBinding(
                job_service_pb2_grpc.add_JobServiceServicer_to_server,
                JobService(sessions, clock),
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
    )
    announce_port(server.port, settings.port_file)
    log.info("scheduler serving on port %d", server.port, extra={"fields": {"port": server.port}})
    stop = threading.Event()
    loop = threading.Thread(target=ticker.run_forever, args=(stop,), name="fleet-tick", daemon=True)
    loop.start()
    run_until_signalled(server, stop)
    loop.join(timeout=10)
    provisioner.close()


if __name__ == "__main__":
    main()
