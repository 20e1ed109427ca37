"""gRPC's own retry policy on the client's channel (no loop of the client's): an attempt
that ends UNAVAILABLE is tried again when the call is safe to repeat, with the same
idempotency key, and not otherwise.

Against the real scheduler, an answer is lost on a cut connection; against a stand-in
JobService (real gRPC, real TLS) that fails on purpose, each attempt is counted."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpufleet.client import AsyncClient, Client, FailedPrecondition, Unavailable
from gpufleet.client.service_config import RETRY_POLICY
from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from tests.integration.client.conftest import Scheduler
from tests.integration.client.cutting_proxy import CuttingProxy
from tests.support import tls


def test_a_submit_whose_answer_was_lost_is_retried_with_its_key(
    scheduler: Scheduler, backend_certs: Path
) -> None:
    proxy = CuttingProxy(scheduler.address)
    try:
        with Client(proxy.address, backend_certs) as fleet:
            fleet.create_workspace("studio-7", "studio")  # the connection is up and idle
            time.sleep(0.3)  # let the last frames of that answer pass before arming the cut
            proxy.cut_next_answer()
            job = fleet.submit_job("studio-7", "clip")
            listed = [j.job_id for j in fleet.list_jobs(workspace="studio-7")]
    finally:
        proxy.close()
    # The first attempt's connection was cut as the scheduler answered; gRPC tried again on
    # a new one, with the same request (so the same key): one job, not two.
    assert (proxy.cuts, proxy.connections) == (1, 2)
    assert listed == [job.job_id]


class StandInJobs(job_service_pb2_grpc.JobServiceServicer):
    """A JobService that answers ``code`` to the first ``failures`` attempts of each method
    and records every attempt's request."""

    def __init__(self, failures: int, code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE) -> None:
        self.failures, self.code = failures, code
        self.attempts: dict[str, list[Any]] = defaultdict(list)

    def _answer(self, method: str, request: Any, context: grpc.ServicerContext, reply: Any) -> Any:
        self.attempts[method].append(request)
        if len(self.attempts[method]) <= self.failures:
            context.abort(self.code, "stand-in: not this time")
        return reply

    def SubmitJob(self, request: Any, context: grpc.ServicerContext) -> job_pb2.Job:
        job = job_pb2.Job(job_id="j-1", request_id=request.request_id)
        return self._answer("SubmitJob", request, context, job)  # type: ignore[no-any-return]

    def GetJob(self, request: Any, context: grpc.ServicerContext) -> job_pb2.Job:
        return self._answer("GetJob", request, context, job_pb2.Job(job_id=request.job_id))  # type: ignore[no-any-return]

    def CancelJob(self, request: Any, context: grpc.ServicerContext) -> job_pb2.Job:
        job = job_pb2.Job(job_id=request.job_id, state=job_pb2.JOB_STATE_CANCELLED)
        return self._answer("CancelJob", request, context, job)  # type: ignore[no-any-return]

    def WatchJob(self, request: Any, context: grpc.ServicerContext) -> Iterator[job_pb2.JobEvent]:
        self.attempts["WatchJob"].append(request)
        context.abort(self.code, "stand-in: not this time")
        yield job_pb2.JobEvent()  # never reached: makes this a generator, as a stream's handler is


def serve(jobs: StandInJobs) -> tuple[grpc.Server, str]:
    """The stand-in on a port of its own, with the scheduler's certificate."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    job_service_pb2_grpc.add_JobServiceServicer_to_server(jobs, server)
    port = tls.transport("scheduler").add_port(server, "127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def flaky() -> Iterator[tuple[StandInJobs, str]]:
    jobs = StandInJobs(failures=2)
    server, address = serve(jobs)
    yield jobs, address
    server.stop(None)


def test_idempotent_calls_are_retried_on_unavailable(
    flaky: tuple[StandInJobs, str], backend_certs: Path
) -> None:
    jobs, address = flaky
    with Client(address, backend_certs) as fleet:
        job = fleet.submit_job("studio-7", "clip")
        assert fleet.get_job("j-1").job_id == "j-1"
        assert fleet.cancel_job("j-1").state == job_pb2.JOB_STATE_CANCELLED
    assert {m: len(a) for m, a in jobs.attempts.items()} == {"SubmitJob": 3, "GetJob": 3, "CancelJob": 3}
    # One key for the call, sent unchanged by every attempt.
    keys = {r.request_id for r in jobs.attempts["SubmitJob"]}
    assert keys == {job.request_id} and job.request_id


def test_the_asyncio_client_is_retried_the_same_way(
    flaky: tuple[StandInJobs, str], backend_certs: Path
) -> None:
    jobs, address = flaky

    async def main() -> job_pb2.Job:
        async with AsyncClient(address, backend_certs) as fleet:
            return await fleet.submit_job("studio-7", "clip")

    job = asyncio.run(main())
    assert [r.request_id for r in jobs.attempts["SubmitJob"]] == [job.request_id] * 3


def test_retries_stop_at_the_policys_attempts(backend_certs: Path) -> None:
    jobs = StandInJobs(failures=100)
    server, address = serve(jobs)
    try:
        with Client(address, backend_certs) as fleet, pytest.raises(Unavailable) as gave_up:
            fleet.get_job("j-1")
    finally:
        server.stop(None)
    assert len(jobs.attempts["GetJob"]) == RETRY_POLICY["maxAttempts"] == 5
    assert gave_up.value.message == "stand-in: not this time"


def test_an_answer_other_than_unavailable_is_not_retried(backend_certs: Path) -> None:
    jobs = StandInJobs(failures=100, code=grpc.StatusCode.FAILED_PRECONDITION)
    server, address = serve(jobs)
    try:
        with Client(address, backend_certs) as fleet, pytest.raises(FailedPrecondition):
            fleet.cancel_job("j-1")
    finally:
        server.stop(None)
    assert len(jobs.attempts["CancelJob"]) == 1


def test_a_method_outside_the_policy_is_tried_once(
    flaky: tuple[StandInJobs, str], backend_certs: Path
) -> None:
    # WatchJob is a stream gRPC must not replay (the watch iterators resume it themselves):
    # on the client's own channel, an UNAVAILABLE WatchJob is not tried again.
    jobs, address = flaky
    with Client(address, backend_certs) as fleet:
        stream = job_service_pb2_grpc.JobServiceStub(fleet.channel).WatchJob(
            job_service_pb2.WatchJobRequest(job_id="j-1"), timeout=10
        )
        with pytest.raises(grpc.RpcError) as refused:
            list(stream)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    assert len(jobs.attempts["WatchJob"]) == 1
