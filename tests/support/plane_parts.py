"""Parts of a control plane that tests build in process, each the real service's own: the
scheduler's WorkerService served over gRPC (every call made as the machine it names), and
the reaper's whole set of nets under the real Ticker and leader lease. Shared by the
reaper's scenarios (``tests/integration/reaper/plane.py``) and the simulator-vs-services
comparison (``tests/integration/sim/services_world.py``)."""

from __future__ import annotations

from contextlib import ExitStack
from datetime import timedelta

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import Clock
from gpufleet.common.grpcserver import ServiceBinding, create_server
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import Ticker
from gpufleet.reaper.agent_probe import GrpcAgentProber
from gpufleet.reaper.idle_scanner import GrpcAgentSampler
from gpufleet.reaper.main import build_watchdogs
from gpufleet.reaper.settings import Settings as ReaperSettings
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.scheduler.worker_service import WorkerService
from gpufleet.v1 import worker_service_pb2, worker_service_pb2_grpc
from tests.support import tls


def serve_workers(
    stack: ExitStack, sessions: sessionmaker[Session], clock: Clock, settings: SchedulerSettings
) -> tls.AsNamedMachine:
    """The scheduler's WorkerService on loopback, and a stub that calls it as each machine."""
    server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                worker_service_pb2_grpc.add_WorkerServiceServicer_to_server,
                WorkerService(sessions, clock, settings),
                worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name,
            )
        ],
        max_workers=2,
        transport=tls.transport("scheduler"),
    )
    stack.callback(server.stop, 0)
    stubs = tls.AsNamedMachine(f"127.0.0.1:{server.port}", worker_service_pb2_grpc.WorkerServiceStub)
    stack.callback(stubs.close)
    return stubs


def reaper_ticker(
    stack: ExitStack,
    settings: ReaperSettings,
    sessions: sessionmaker[Session],
    clock: Clock,
    provisioner_address: str,
) -> tuple[Ticker, CallPool]:
    """The reaper's nets (``build_watchdogs``) under its Ticker and lease, sampling and
    probing agents over gRPC; the pool its stops and destroys run in."""
    client = ProvisionerClient(provisioner_address, tls.transport("reaper"), timeout_s=5.0)
    stack.callback(client.close)
    lease = LeaderLease("reaper", settings.instance_name, clock, sessions, ttl_s=settings.lease_ttl_s)
    calls = CallPool(settings.provider_call_workers, "provider-calls")
    stack.callback(calls.close)
    tasks = build_watchdogs(
        settings,
        sessions,
        lease,
        clock,
        client,
        GrpcAgentSampler(tls.transport("reaper"), window=timedelta(0), timeout_s=settings.agent_timeout_s),
        GrpcAgentProber(tls.transport("reaper"), timeout_s=settings.agent_timeout_s),
        calls=calls,
    )
    return Ticker("reaper", clock, sessions, lease, tasks, renew_s=settings.lease_renew_s), calls
