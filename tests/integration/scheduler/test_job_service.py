"""JobService through a real scheduler process, real gRPC and real PostgreSQL: what the
product backend sees, including every kind of bad input."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from sqlalchemy import func, select

from gpufleet.common import paging
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from tests.support.procs import ServiceProcess


@pytest.fixture
def stub(scheduler: ServiceProcess) -> Iterator[job_service_pb2_grpc.JobServiceStub]:
    with scheduler.channel("backend") as channel:
        yield job_service_pb2_grpc.JobServiceStub(channel)


def submit_request(request_id: str = "req-1", **overrides: object) -> job_service_pb2.SubmitJobRequest:
    fields: dict[str, object] = {
        "workspace": "acme-studio",
        "pool": "l4",
        "kind": "short_episode",
        "pipeline_version": "2026.11.3",
        "tenant_values": {"topic": "volcanoes"},
    }
    fields.update(overrides)
    return job_service_pb2.SubmitJobRequest(request_id=request_id, job=job_pb2.Job(**fields))  # type: ignore[arg-type]


def field_of(err: grpc.RpcError) -> str | None:
    return dict(err.trailing_metadata() or ()).get("gpufleet-field")  # type: ignore[attr-defined]


def count(pg_url: str, model: type[models.Base]) -> int:
    with make_sessionmaker(make_engine(pg_url))() as s:
        return int(s.execute(select(func.count()).select_from(model)).scalar_one())


def test_submit_is_idempotent_and_listed(stub: job_service_pb2_grpc.JobServiceStub, pg_url: str) -> None:
    first = stub.SubmitJob(submit_request(), timeout=5)
    again = stub.SubmitJob(submit_request(), timeout=5)
    assert first.job_id == again.job_id
    assert first.state == job_pb2.JOB_STATE_QUEUED
    assert first.tenant_values["topic"] == "volcanoes"
    got = stub.GetJob(job_service_pb2.GetJobRequest(job_id=first.job_id), timeout=5)
    assert got.request_id == "req-1" and got.workspace == "acme-studio"
    assert count(pg_url, models.Job) == 1


def test_a_jobs_resource_name_is_accepted_where_its_id_is(stub: job_service_pb2_grpc.JobServiceStub) -> None:
    job = stub.SubmitJob(submit_request("by-name"), timeout=5)
    assert job.name == f"jobs/{job.job_id}"
    assert stub.GetJob(job_service_pb2.GetJobRequest(job_id=job.name), timeout=5).job_id == job.job_id
    cancelled = stub.CancelJob(job_service_pb2.CancelJobRequest(job_id=job.name), timeout=5)
    assert cancelled.state == job_pb2.JOB_STATE_CANCELLED
    events = list(stub.WatchJob(job_service_pb2.WatchJobRequest(job_id=job.name), timeout=10))
    assert events[-1].state == job_pb2.JOB_STATE_CANCELLED
    with pytest.raises(grpc.RpcError) as info:
        stub.GetJob(job_service_pb2.GetJobRequest(job_id="machines/" + job.job_id), timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]


def test_list_pages_through_every_job(stub: job_service_pb2_grpc.JobServiceStub) -> None:
    ids = [stub.SubmitJob(submit_request(f"r{i}"), timeout=5).job_id for i in range(7)]
    seen: list[str] = []
    token = ""
    while True:
        page = stub.ListJobs(
            job_service_pb2.ListJobsRequest(page_size=3, page_token=token, workspace="acme-studio"), timeout=5
        )
        assert len(page.jobs) <= 3
        seen += [j.job_id for j in page.jobs]
        token = page.next_page_token
        if not token:
            break
    assert seen == ids
    none = stub.ListJobs(job_service_pb2.ListJobsRequest(workspace="indie-creator"), timeout=5)
    assert list(none.jobs) == []


def test_cancel_a_queued_job_and_watch_it_end(stub: job_service_pb2_grpc.JobServiceStub) -> None:
    job = stub.SubmitJob(submit_request(), timeout=5)
    cancelled = stub.CancelJob(
        job_service_pb2.CancelJobRequest(job_id=job.job_id, reason="changed mind"), timeout=5
    )
    assert cancelled.state == job_pb2.JOB_STATE_CANCELLED
    events = list(stub.WatchJob(job_service_pb2.WatchJobRequest(job_id=job.job_id), timeout=10))
    assert [e.state for e in events] == [job_pb2.JOB_STATE_QUEUED, job_pb2.JOB_STATE_CANCELLED]
    # Cancelling again is harmless.
    assert (
        stub.CancelJob(job_service_pb2.CancelJobRequest(job_id=job.job_id), timeout=5).state
        == job_pb2.JOB_STATE_CANCELLED
    )


BAD_SUBMITS = [
    (submit_request(""), grpc.StatusCode.INVALID_ARGUMENT, "request_id"),
    (submit_request("has spaces"), grpc.StatusCode.INVALID_ARGUMENT, "request_id"),
    (submit_request("x" * 200), grpc.StatusCode.INVALID_ARGUMENT, "request_id"),
    (job_service_pb2.SubmitJobRequest(request_id="r"), grpc.StatusCode.INVALID_ARGUMENT, "job"),
    (submit_request(workspace=""), grpc.StatusCode.INVALID_ARGUMENT, "job.workspace"),
    (submit_request(workspace="nobody"), grpc.StatusCode.NOT_FOUND, "job.workspace"),
    (submit_request(pool="h100"), grpc.StatusCode.NOT_FOUND, "job.pool"),
    (submit_request(kind="opera"), grpc.StatusCode.NOT_FOUND, "job.kind"),
    (submit_request(kind=""), grpc.StatusCode.INVALID_ARGUMENT, "job.kind"),
    (
        submit_request(pipeline_version="1.0; rm -rf /"),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.pipeline_version",
    ),
    (
        submit_request(tenant_values={"topic": "x" * 10_000}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.tenant_values['topic']",
    ),
    (
        submit_request(tenant_values={f"k{i}": "v" for i in range(65)}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.tenant_values",
    ),
    (
        submit_request(tenant_values={"bad key!": "v"}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.tenant_values['bad key!']",
    ),
    # A key of non-ASCII text: its name reaches the gpufleet-field trailer escaped (gRPC
    # metadata is ASCII), where it once made the answer INTERNAL.
    (
        submit_request(tenant_values={"thème": "v"}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "job.tenant_values['th\\xe8me']",
    ),
]


@pytest.mark.parametrize(("request_msg", "code", "field"), BAD_SUBMITS)
def test_bad_submit_names_the_field_and_stores_nothing(
    stub: job_service_pb2_grpc.JobServiceStub,
    pg_url: str,
    request_msg: job_service_pb2.SubmitJobRequest,
    code: grpc.StatusCode,
    field: str,
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.SubmitJob(request_msg, timeout=5)
    assert info.value.code() == code  # type: ignore[attr-defined]
    assert field_of(info.value) == field
    assert field in (info.value.details() or "")  # type: ignore[attr-defined]
    assert count(pg_url, models.Job) == 0
    assert count(pg_url, models.JobEvent) == 0


def test_reused_request_id_with_other_content_is_refused_and_keeps_the_first(
    stub: job_service_pb2_grpc.JobServiceStub, pg_url: str
) -> None:
    first = stub.SubmitJob(submit_request(), timeout=5)
    with pytest.raises(grpc.RpcError) as info:
        stub.SubmitJob(submit_request(tenant_values={"topic": "glaciers"}), timeout=5)
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS  # type: ignore[attr-defined]
    assert field_of(info.value) == "request_id"
    kept = stub.GetJob(job_service_pb2.GetJobRequest(job_id=first.job_id), timeout=5)
    assert kept.tenant_values["topic"] == "volcanoes"
    assert count(pg_url, models.Job) == 1


@pytest.mark.parametrize(
    ("call", "code", "field"),
    [
        (
            lambda s: s.GetJob(job_service_pb2.GetJobRequest(job_id=""), timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT,
            "job_id",
        ),
        (
            lambda s: s.GetJob(job_service_pb2.GetJobRequest(job_id="nope"), timeout=5),
            grpc.StatusCode.NOT_FOUND,
            "job_id",
        ),
        (
            lambda s: s.CancelJob(job_service_pb2.CancelJobRequest(job_id=""), timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT,
            "job_id",
        ),
        (
            lambda s: s.CancelJob(job_service_pb2.CancelJobRequest(job_id="nope"), timeout=5),
            grpc.StatusCode.NOT_FOUND,
            "job_id",
        ),
        (
            lambda s: list(s.WatchJob(job_service_pb2.WatchJobRequest(job_id="nope"), timeout=5)),
            grpc.StatusCode.NOT_FOUND,
            "job_id",
        ),
        (
            lambda s: list(s.WatchJob(job_service_pb2.WatchJobRequest(job_id=""), timeout=5)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "job_id",
        ),
        (
            lambda s: s.ListJobs(job_service_pb2.ListJobsRequest(page_token="garbage!!"), timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token",
        ),
        (
            lambda s: s.ListJobs(
                job_service_pb2.ListJobsRequest(page_token="eyJrIjoibWFjaGluZXMiLCJwIjoieCJ9"), timeout=5
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token",
        ),
        (
            # The jobs list's own kind, with a position that is an object, not a pair.
            lambda s: s.ListJobs(
                job_service_pb2.ListJobsRequest(page_token=paging.encode("jobs", {"0": "x"})), timeout=5
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_token",
        ),
        (
            lambda s: s.ListJobs(job_service_pb2.ListJobsRequest(page_size=-1), timeout=5),
            grpc.StatusCode.INVALID_ARGUMENT,
            "page_size",
        ),
        (
            lambda s: s.ListJobs(job_service_pb2.ListJobsRequest(workspace="nobody"), timeout=5),
            grpc.StatusCode.NOT_FOUND,
            "workspace",
        ),
        (
            lambda s: s.ListJobs(job_service_pb2.ListJobsRequest(pool="nope"), timeout=5),
            grpc.StatusCode.NOT_FOUND,
            "pool",
        ),
    ],
)
def test_bad_reads_and_cancels_name_the_field(
    stub: job_service_pb2_grpc.JobServiceStub, call: object, code: grpc.StatusCode, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(stub)  # type: ignore[operator]
    assert info.value.code() == code  # type: ignore[attr-defined]
    assert field_of(info.value) == field


def test_cancelling_a_finished_job_is_a_failed_precondition(
    stub: job_service_pb2_grpc.JobServiceStub, pg_url: str
) -> None:
    job = stub.SubmitJob(submit_request(), timeout=5)
    sessions = make_sessionmaker(make_engine(pg_url))
    with sessions() as s, s.begin():
        s.get_one(models.Job, job.job_id).state = "SUCCEEDED"
    with pytest.raises(grpc.RpcError) as info:
        stub.CancelJob(job_service_pb2.CancelJobRequest(job_id=job.job_id), timeout=5)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
