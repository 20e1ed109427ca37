"""What SubmitJob promises a backend, through a real scheduler process, real gRPC with TLS
and real PostgreSQL: every bad field of a request in one answer, as the standard rich error
model (google.rpc.Status with BadRequest, ErrorInfo, RetryInfo) that any gRPC client
decodes; and the pool and pipeline version a job leaves out taken from its kind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from sqlalchemy import func, select

from gpufleet.common import grpcclient
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.errors import DOMAIN, Violation
from gpufleet.common.rich_status import details_of
from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from tests.support.procs import ServiceProcess, start_service
from tests.support.rich_errors import rich_status, unpacked


@pytest.fixture
def stub(scheduler: ServiceProcess) -> Iterator[job_service_pb2_grpc.JobServiceStub]:
    with scheduler.channel("backend") as channel:
        yield job_service_pb2_grpc.JobServiceStub(channel)


def jobs_stored(pg_url: str) -> int:
    with make_sessionmaker(make_engine(pg_url))() as s:
        return int(s.execute(select(func.count()).select_from(models.Job)).scalar_one())


def test_a_submit_with_several_bad_fields_lists_every_one_at_once(
    stub: job_service_pb2_grpc.JobServiceStub, pg_url: str
) -> None:
    bad = job_service_pb2.SubmitJobRequest(
        request_id="has spaces",
        job=job_pb2.Job(
            workspace="",
            pool="Not A Pool!",
            kind="",
            pipeline_version="1.0; rm -rf /",
            tenant_values={"bad key!": "v", "fine": "v", "huge": "x" * 10_000},
        ),
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.SubmitJob(bad, timeout=5)
    err = info.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]

    status = rich_status(err)
    (request,) = unpacked(status, error_details_pb2.BadRequest)
    assert [(v.field, v.reason) for v in request.field_violations] == [
        ("request_id", "INVALID_FORMAT"),
        ("job.workspace", "REQUIRED"),
        ("job.pool", "INVALID_FORMAT"),
        ("job.kind", "REQUIRED"),
        ("job.pipeline_version", "INVALID_FORMAT"),
        ("job.tenant_values['bad key!']", "INVALID_FORMAT"),
        ("job.tenant_values['huge']", "TOO_LARGE"),
    ]
    assert all(v.description for v in request.field_violations)
    (error_info,) = unpacked(status, error_details_pb2.ErrorInfo)
    assert (error_info.reason, error_info.domain) == ("INVALID_REQUEST", DOMAIN)
    assert error_info.metadata["field"] == "request_id"
    assert not unpacked(status, error_details_pb2.RetryInfo)  # the same request cannot pass later
    # The message a person reads names them all too.
    for field in ("request_id", "job.workspace", "job.pool", "job.kind", "job.pipeline_version"):
        assert field in (err.details() or "")  # type: ignore[attr-defined]
    # The services' own client wraps it with every violation.
    wrapped = grpcclient.wrap_rpc_error(err)
    assert wrapped.field == "request_id"
    assert wrapped.reason == "INVALID_REQUEST"
    assert len(wrapped.violations) == 7
    assert wrapped.violations[2] == Violation("job.pool", "is not a valid pool id", "INVALID_FORMAT")
    assert jobs_stored(pg_url) == 0


def test_a_missing_job_is_one_violation(stub: job_service_pb2_grpc.JobServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        stub.SubmitJob(job_service_pb2.SubmitJobRequest(request_id="r"), timeout=5)
    (request,) = unpacked(rich_status(info.value), error_details_pb2.BadRequest)
    assert [(v.field, v.reason) for v in request.field_violations] == [("job", "REQUIRED")]


def test_an_unknown_workspace_says_why_in_error_info(stub: job_service_pb2_grpc.JobServiceStub) -> None:
    request = job_service_pb2.SubmitJobRequest(
        request_id="r-unknown", job=job_pb2.Job(workspace="nobody", kind="short_episode")
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.SubmitJob(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    (error_info,) = unpacked(rich_status(info.value), error_details_pb2.ErrorInfo)
    assert (error_info.reason, error_info.domain) == ("UNKNOWN_WORKSPACE", DOMAIN)
    assert error_info.metadata["field"] == "job.workspace"
    # Not a request's shape: no BadRequest (the standard's NOT_FOUND carries none).
    assert not unpacked(rich_status(info.value), error_details_pb2.BadRequest)


def test_a_reused_request_id_names_its_reason(stub: job_service_pb2_grpc.JobServiceStub) -> None:
    job = job_pb2.Job(workspace="acme-studio", kind="clip", tenant_values={"topic": "a"})
    stub.SubmitJob(job_service_pb2.SubmitJobRequest(request_id="r-reused", job=job), timeout=5)
    job.tenant_values["topic"] = "b"
    with pytest.raises(grpc.RpcError) as info:
        stub.SubmitJob(job_service_pb2.SubmitJobRequest(request_id="r-reused", job=job), timeout=5)
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS  # type: ignore[attr-defined]
    assert details_of(info.value).reason == "REQUEST_ID_REUSED"


def test_pool_and_pipeline_version_left_out_come_from_the_kind(
    stub: job_service_pb2_grpc.JobServiceStub,
) -> None:
    request = job_service_pb2.SubmitJobRequest(
        request_id="r-defaults", job=job_pb2.Job(workspace="acme-studio", kind="short_episode")
    )
    job = stub.SubmitJob(request, timeout=5)
    assert (job.pool, job.pipeline_version) == ("l4", "2026.12.0")
    stored = stub.GetJob(job_service_pb2.GetJobRequest(job_id=job.job_id), timeout=5)
    assert (stored.pool, stored.pipeline_version) == ("l4", "2026.12.0")
    # A retry of the same request is the same job; one naming its own version is honoured.
    assert stub.SubmitJob(request, timeout=5).job_id == job.job_id
    own = job_pb2.Job(workspace="acme-studio", kind="short_episode", pipeline_version="2027.1.0")
    named = stub.SubmitJob(job_service_pb2.SubmitJobRequest(request_id="r-own", job=own), timeout=5)
    assert (named.pool, named.pipeline_version) == ("l4", "2027.1.0")


def test_a_left_out_pool_for_an_unknown_kind_names_the_kind(
    stub: job_service_pb2_grpc.JobServiceStub,
) -> None:
    request = job_service_pb2.SubmitJobRequest(
        request_id="r-opera", job=job_pb2.Job(workspace="acme-studio", kind="opera")
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.SubmitJob(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND  # type: ignore[attr-defined]
    assert details_of(info.value).field == "job.kind"


# A kind no pool fits (4 slots; machines have 2) and no pipeline version of its own.
CATALOGUE = """
[[plans]]
id = "studio"

[[workspaces]]
id = "acme-studio"
plan = "studio"

[[kinds]]
id = "wide"
slots = 4
time_limit_s = 3600

[[kinds]]
id = "clip"
time_limit_s = 600
default_pipeline_version = "7.0"

[[pools]]
id = "l4"
slots_per_machine = 2

[[pools.offerings]]
id = "local-l4"
provider = "LOCAL"
region = "local"
zone = "local-a"
instance_type = "local-g2"
slots = 2
hourly_price_micros = 850000
"""


@pytest.fixture
def own_catalogue(pg_url: str, tmp_path: Path) -> Iterator[ServiceProcess]:
    path = tmp_path / "catalogue.toml"
    path.write_text(CATALOGUE)
    svc = start_service(
        "scheduler",
        tmp_path,
        {
            "GPUFLEET_DATABASE_URL": pg_url,
            "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:9",
            "GPUFLEET_MAX_RUNNING_MACHINES": "0",
            "GPUFLEET_CATALOG_FILE": str(path),
        },
    )
    yield svc
    svc.stop()


def test_a_kind_without_defaults_names_both_missing_fields_at_once(
    own_catalogue: ServiceProcess, pg_url: str
) -> None:
    with own_catalogue.channel("backend") as channel:
        stub = job_service_pb2_grpc.JobServiceStub(channel)
        request = job_service_pb2.SubmitJobRequest(
            request_id="r-wide", job=job_pb2.Job(workspace="acme-studio", kind="wide")
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.SubmitJob(request, timeout=5)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        (bad,) = unpacked(rich_status(info.value), error_details_pb2.BadRequest)
        assert [(v.field, v.reason) for v in bad.field_violations] == [
            ("job.pool", "REQUIRED"),
            ("job.pipeline_version", "REQUIRED"),
        ]
        assert "kind 'wide' has no default pool" in bad.field_violations[0].description
        assert jobs_stored(pg_url) == 0
        # The catalogue's first pool that fits is a kind's default when it names none.
        clip = stub.SubmitJob(
            job_service_pb2.SubmitJobRequest(
                request_id="r-clip", job=job_pb2.Job(workspace="acme-studio", kind="clip")
            ),
            timeout=5,
        )
        assert (clip.pool, clip.pipeline_version) == ("l4", "7.0")


def test_too_many_watches_answer_resource_exhausted_with_a_retry_delay(
    scheduler: ServiceProcess, stub: job_service_pb2_grpc.JobServiceStub
) -> None:
    job = stub.SubmitJob(
        job_service_pb2.SubmitJobRequest(
            request_id="r-watched", job=job_pb2.Job(workspace="acme-studio", kind="clip")
        ),
        timeout=5,
    )
    # One connection's cap (16) of streams, each served: its first event read.
    held = [stub.WatchJob(job_service_pb2.WatchJobRequest(job_id=job.job_id), timeout=60) for _ in range(16)]
    try:
        for h in held:
            next(h)
        with pytest.raises(grpc.RpcError) as info:
            next(stub.WatchJob(job_service_pb2.WatchJobRequest(job_id=job.job_id), timeout=10))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        (retry,) = unpacked(rich_status(info.value), error_details_pb2.RetryInfo)
        assert retry.retry_delay.ToTimedelta().total_seconds() > 0
        assert details_of(info.value).retry_after_s == retry.retry_delay.ToTimedelta().total_seconds()
        (error_info,) = unpacked(rich_status(info.value), error_details_pb2.ErrorInfo)
        assert (error_info.reason, error_info.domain) == ("TOO_MANY_WATCHES", DOMAIN)
    finally:
        for h in held:
            h.cancel()  # type: ignore[attr-defined]
