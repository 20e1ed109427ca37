"""No caller can starve the workers' reports: 200 WatchJob streams, read no further than
their first event, held open against a real scheduler process, while a machine's worker
reports, a backend submits and an operator lists machines.

Before the scheduler served on an asyncio server, 50 such streams took all 32 of its
threads: ListMachines and the health check timed out, heartbeats went undelivered, and
a running job was lost with "lease expired".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import select

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import (
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    job_pb2,
    job_service_pb2,
    job_service_pb2_grpc,
    machine_pb2,
    worker_service_pb2,
    worker_service_pb2_grpc,
)
from tests.support import tls
from tests.support.procs import ServiceProcess
from tests.support.scripted_services import ScriptedAgent, serve_agent

STREAMS, CHANNELS = 200, 20


@pytest.fixture
def agent() -> Iterator[ScriptedAgent]:
    with serve_agent() as a:
        yield a


def submit(stub: job_service_pb2_grpc.JobServiceStub, request_id: str) -> job_pb2.Job:
    job = job_pb2.Job(workspace="acme-studio", pool="l4", kind="short_episode", pipeline_version="2026.11.3")
    reply: job_pb2.Job = stub.SubmitJob(
        job_service_pb2.SubmitJobRequest(request_id=request_id, job=job), timeout=5
    )
    return reply


def test_two_hundred_unread_streams_leave_heartbeats_submissions_and_leases_alone(
    scheduler: ServiceProcess, agent: ScriptedAgent, pg_url: str
) -> None:
    # Each channel its own connection (by default channels to one address share one).
    own = [("grpc.use_local_subchannel_pool", 1)]
    # The operator's connection, the 20 of the backend's streams, and the machine's own.
    channels = [tls.channel(scheduler.address, Role.SCHEDULER, who="operator", options=own)] + [
        tls.channel(scheduler.address, Role.SCHEDULER, who="backend", options=own) for _ in range(CHANNELS)
    ]
    box = tls.channel(scheduler.address, Role.SCHEDULER, who="machine:box-1", options=own)
    channels.append(box)
    try:
        jobs = job_service_pb2_grpc.JobServiceStub(channels[0])
        workers = worker_service_pb2_grpc.WorkerServiceStub(box)
        fleet = fleet_service_pb2_grpc.FleetServiceStub(channels[0])
        health = health_pb2_grpc.HealthStub(channels[0])

        # A machine whose worker reports, and a job that runs on it.
        workers.RegisterMachine(
            worker_service_pb2.RegisterMachineRequest(
                request_id="box-1",
                machine_id="box-1",
                agent_address=agent.address,
                pool="l4",
                slots=2,
                workload_class=machine_pb2.WORKLOAD_CLASS_REPORTING,
            ),
            timeout=5,
        )
        workers.ReportHeartbeat(worker_service_pb2.ReportHeartbeatRequest(machine_id="box-1"), timeout=5)
        running = submit(jobs, "runs-throughout")
        deadline = time.monotonic() + 30
        while not agent.started and time.monotonic() < deadline:
            time.sleep(0.1)
        (attempt_id,) = agent.started

        # 200 streams over 20 connections, read no further than their first event;
        # then one connection asks past its cap.
        held = [
            job_service_pb2_grpc.JobServiceStub(channels[1 + i % CHANNELS]).WatchJob(
                job_service_pb2.WatchJobRequest(job_id=running.job_id), timeout=300
            )
            for i in range(STREAMS)
        ]
        # Each has its first event, so the scheduler serves (and counts) every one of them
        # before the greedy connection asks for more; after that none is read again.
        for h in held:
            next(h)
        greedy = job_service_pb2_grpc.JobServiceStub(channels[1])
        with pytest.raises(grpc.RpcError) as refused:
            # This connection holds 10 already; 7 more pass its cap of 16.
            for extra in [
                greedy.WatchJob(job_service_pb2.WatchJobRequest(job_id=running.job_id)) for _ in range(7)
            ]:
                next(extra)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        time.sleep(1.0)  # every stream is open and waiting on its unread client

        # The worker keeps reporting, each report fast; submissions and reads go through.
        slowest = 0.0
        for n in range(20):
            t0 = time.monotonic()
            reply = workers.ReportHeartbeat(
                worker_service_pb2.ReportHeartbeatRequest(
                    machine_id="box-1",
                    running=[worker_service_pb2.RunningAttempt(attempt_id=attempt_id, slot=0)],
                ),
                timeout=5,
            )
            slowest = max(slowest, time.monotonic() - t0)
            assert attempt_id not in reply.cancel_attempt_ids
            submit(jobs, f"during-{n}")
            fleet.ListMachines(fleet_service_pb2.ListMachinesRequest(), timeout=5)
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.SERVING
            time.sleep(0.1)
        assert slowest < 2.0, f"a heartbeat took {slowest:.2f}s"

        engine = make_engine(pg_url)
        try:
            with make_sessionmaker(engine)() as s:
                attempt = s.get_one(models.Attempt, attempt_id)
                queued = s.execute(select(models.Job).where(models.Job.request_id.like("during-%"))).all()
        finally:
            engine.dispose()
        assert attempt.state in ("STARTING", "RUNNING"), attempt.status_message
        assert attempt.lease_expires_at > datetime.now(UTC), "the lease was renewed by the reports"
        assert len(queued) == 20
        ended = [(h.code(), h.details()) for h in held if not h.is_active()]  # type: ignore[attr-defined]
        assert not ended, f"{len(ended)} held streams ended: {ended[:3]}"
        for h in held:
            h.cancel()  # type: ignore[attr-defined]
    finally:
        for c in channels:
            c.close()
