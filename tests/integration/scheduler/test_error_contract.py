"""What every scheduler method besides SubmitJob promises a backend or an operator about
errors, through a real scheduler process, real gRPC with TLS and real PostgreSQL: a request
with several bad fields gets one INVALID_ARGUMENT whose BadRequest names every one of them,
each with its own reason; a refusal about what the request names (an unknown job, a job
that already ended, a machine that is busy) says so in ErrorInfo with a reason a client can
branch on. Decoded with grpcio-status and google.rpc's own messages, as any client would."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import paging
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.scheduler.job_service import MAX_LOG_PAGE
from gpufleet.v1 import (
    catalog_pb2,
    catalog_service_pb2,
    catalog_service_pb2_grpc,
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    job_service_pb2,
    job_service_pb2_grpc,
    workspace_service_pb2,
    workspace_service_pb2_grpc,
)
from tests.support.fleet_rows import add_attempt, add_job, add_machine
from tests.support.procs import ServiceProcess
from tests.support.rich_errors import assert_bad_request, assert_refused, refusal

NOT_FOUND = grpc.StatusCode.NOT_FOUND
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
ALREADY_EXISTS = grpc.StatusCode.ALREADY_EXISTS
# A valid token of another list: a page token this list never gave out.
OTHER_LISTS_TOKEN = paging.encode("machines", "m-1")
PAGING_BOTH_BAD = [("page_size", "OUT_OF_RANGE"), ("page_token", "INVALID_PAGE_TOKEN")]

J = job_service_pb2
W = workspace_service_pb2
F = fleet_service_pb2


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(pg_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def jobs(scheduler: ServiceProcess) -> Iterator[job_service_pb2_grpc.JobServiceStub]:
    with scheduler.channel("backend") as channel:
        yield job_service_pb2_grpc.JobServiceStub(channel)


@pytest.fixture
def workspaces(scheduler: ServiceProcess) -> Iterator[workspace_service_pb2_grpc.WorkspaceServiceStub]:
    with scheduler.channel("backend") as channel:
        yield workspace_service_pb2_grpc.WorkspaceServiceStub(channel)


@pytest.fixture
def fleet(scheduler: ServiceProcess) -> Iterator[fleet_service_pb2_grpc.FleetServiceStub]:
    with scheduler.channel() as channel:  # an operator
        yield fleet_service_pb2_grpc.FleetServiceStub(channel)


def count(sessions: sessionmaker[Session], model: type[models.Base]) -> int:
    with sessions() as s:
        return int(s.execute(select(func.count()).select_from(model)).scalar_one())


def ws(**fields: object) -> catalog_pb2.Workspace:
    return catalog_pb2.Workspace(**fields)  # type: ignore[arg-type]


# -- JobService ---------------------------------------------------------------------------


def test_job_service_names_every_bad_field_at_once(
    jobs: job_service_pb2_grpc.JobServiceStub, sessions: sessionmaker[Session]
) -> None:
    got = refusal(jobs.ListJobs, J.ListJobsRequest(page_size=-1, page_token="garbage!!", state=99))
    assert_bad_request(got, [*PAGING_BOTH_BAD, ("state", "UNKNOWN_VALUE")])
    # The jobs list's own kind but not a position it gave out, and another list's token.
    for token in (paging.encode("jobs", {"0": "x"}), paging.encode("jobs", ["noon", "j"]), OTHER_LISTS_TOKEN):
        assert_bad_request(
            refusal(jobs.ListJobs, J.ListJobsRequest(page_token=token)),
            [("page_token", "INVALID_PAGE_TOKEN")],
        )

    cancel = J.CancelJobRequest(job_id="no such id!", request_id="has spaces", reason="x" * 1025)
    assert_bad_request(
        refusal(jobs.CancelJob, cancel),
        [("job_id", "INVALID_FORMAT"), ("request_id", "INVALID_FORMAT"), ("reason", "TOO_LONG")],
    )
    # A good job id with the rest bad: refused whole, the job left as it was.
    queued = add_job(sessions, datetime.now(UTC))
    cancel = J.CancelJobRequest(job_id=queued, request_id="has spaces", reason="x" * 1025)
    assert_bad_request(
        refusal(jobs.CancelJob, cancel), [("request_id", "INVALID_FORMAT"), ("reason", "TOO_LONG")]
    )
    with sessions() as s:
        assert s.get_one(models.Job, queued).state == "QUEUED"

    log = J.GetJobLogRequest(job_id="", attempt_id="not/an/id", offset=-1, max_bytes=MAX_LOG_PAGE + 1)
    assert_bad_request(
        refusal(jobs.GetJobLog, log),
        [
            ("job_id", "REQUIRED"),
            ("attempt_id", "INVALID_FORMAT"),
            ("offset", "OUT_OF_RANGE"),
            ("max_bytes", "OUT_OF_RANGE"),
        ],
    )

    # The one-field calls: their one bad field, the same way.
    assert_bad_request(
        refusal(jobs.GetJob, J.GetJobRequest(job_id="machines/x")), [("job_id", "INVALID_FORMAT")]
    )
    assert_bad_request(refusal(jobs.WatchJob, J.WatchJobRequest(job_id="")), [("job_id", "REQUIRED")])


def test_job_service_says_why_in_error_info(
    jobs: job_service_pb2_grpc.JobServiceStub, sessions: sessionmaker[Session]
) -> None:
    now = datetime.now(UTC)
    unknown = "5b6a2c8e-0000-4000-8000-000000000000"
    for method, request in (
        (jobs.GetJob, J.GetJobRequest(job_id=unknown)),
        (jobs.CancelJob, J.CancelJobRequest(job_id=unknown)),
        (jobs.WatchJob, J.WatchJobRequest(job_id=unknown)),
        (jobs.GetJobLog, J.GetJobLogRequest(job_id=unknown)),
    ):
        assert_refused(refusal(method, request), NOT_FOUND, "UNKNOWN_JOB", "job_id")

    ended = add_job(sessions, now, state="SUCCEEDED")
    got = refusal(jobs.CancelJob, J.CancelJobRequest(job_id=ended))
    assert_refused(got, FAILED_PRECONDITION, "JOB_ALREADY_ENDED", "job_id")

    queued = add_job(sessions, now)
    got = refusal(jobs.GetJobLog, J.GetJobLogRequest(job_id=queued))
    assert_refused(got, NOT_FOUND, "JOB_NOT_STARTED", "job_id")
    got = refusal(jobs.GetJobLog, J.GetJobLogRequest(job_id=queued, attempt_id="a-1"))
    assert_refused(got, NOT_FOUND, "UNKNOWN_ATTEMPT", "attempt_id")

    for state, reason in (("DESTROYED", "LOG_MACHINE_DESTROYED"), ("STOPPED", "LOG_MACHINE_NOT_RUNNING")):
        attempt = add_attempt(sessions, now, add_machine(sessions, now, state=state), state="SUCCEEDED")
        with sessions() as s:
            ran = s.get_one(models.Attempt, attempt).job_id
        got = refusal(jobs.GetJobLog, J.GetJobLogRequest(job_id=ran))
        assert_refused(got, FAILED_PRECONDITION, reason, "attempt_id")

    got = refusal(jobs.ListJobs, J.ListJobsRequest(workspace="nobody"))
    assert_refused(got, NOT_FOUND, "UNKNOWN_WORKSPACE", "workspace")
    got = refusal(jobs.ListJobs, J.ListJobsRequest(pool="h100"))
    assert_refused(got, NOT_FOUND, "UNKNOWN_POOL", "pool")


# -- WorkspaceService ---------------------------------------------------------------------


def test_workspace_service_names_every_bad_field_at_once(
    workspaces: workspace_service_pb2_grpc.WorkspaceServiceStub, sessions: sessionmaker[Session]
) -> None:
    before = count(sessions, models.Workspace)
    got = refusal(
        workspaces.CreateWorkspace, W.CreateWorkspaceRequest(workspace=ws(workspace_id="Not Valid!"))
    )
    assert_bad_request(
        got,
        [
            ("request_id", "REQUIRED"),
            ("workspace.workspace_id", "INVALID_FORMAT"),
            ("workspace.plan", "REQUIRED"),
        ],
    )
    assert count(sessions, models.Workspace) == before

    update = W.UpdateWorkspaceRequest(
        workspace=ws(active=False), update_mask=["plan", "id", "active", "name"], request_id="has spaces"
    )
    assert_bad_request(
        refusal(workspaces.UpdateWorkspace, update),
        [
            ("workspace.workspace_id", "REQUIRED"),
            ("workspace.plan", "REQUIRED"),
            ("update_mask[1]", "NOT_SETTABLE"),
            ("update_mask[3]", "NOT_SETTABLE"),
            ("request_id", "INVALID_FORMAT"),
        ],
    )
    # A mask of many paths it cannot set: the first 20 named, the rest counted, so the
    # answer stays small whatever was sent.
    update = W.UpdateWorkspaceRequest(
        workspace=ws(workspace_id="acme-studio"), update_mask=[f"f{i}" for i in range(5000)]
    )
    got = refusal(workspaces.UpdateWorkspace, update)
    assert got.violations == [(f"update_mask[{i}]", "NOT_SETTABLE") for i in range(20)] + [
        ("update_mask", "NOT_SETTABLE")
    ]
    assert "4980 more" in got.descriptions[-1]
    update = W.UpdateWorkspaceRequest(workspace=ws(workspace_id="acme-studio", active=False))
    assert_bad_request(refusal(workspaces.UpdateWorkspace, update), [("update_mask", "REQUIRED")])
    with sessions() as s:
        assert s.get_one(models.Workspace, "acme-studio").active

    usage = W.GetUsageRequest(workspace_id="workspaces/Not Valid!", end_time=Timestamp(seconds=10**13))
    assert_bad_request(
        refusal(workspaces.GetUsage, usage),
        [("workspace_id", "INVALID_FORMAT"), ("start_time", "REQUIRED"), ("end_time", "INVALID_FORMAT")],
    )
    usage = W.GetUsageRequest(
        workspace_id="", start_time=Timestamp(seconds=2000), end_time=Timestamp(seconds=1000)
    )
    assert_bad_request(
        refusal(workspaces.GetUsage, usage), [("workspace_id", "REQUIRED"), ("end_time", "OUT_OF_RANGE")]
    )

    listing = catalog_pb2.ListWorkspacesRequest(page_size=-1, page_token=OTHER_LISTS_TOKEN)
    assert_bad_request(refusal(workspaces.ListWorkspaces, listing), PAGING_BOTH_BAD)


def test_workspace_service_says_why_in_error_info(
    workspaces: workspace_service_pb2_grpc.WorkspaceServiceStub,
) -> None:
    def create(request_id: str, workspace_id: str, plan: str) -> W.CreateWorkspaceRequest:
        return W.CreateWorkspaceRequest(
            request_id=request_id, workspace=ws(workspace_id=workspace_id, plan=plan)
        )

    got = refusal(workspaces.CreateWorkspace, create("c1", "new", "gold"))
    assert_refused(got, NOT_FOUND, "UNKNOWN_PLAN", "workspace.plan")
    # The catalogue seeded acme-studio: another request cannot take its id.
    got = refusal(workspaces.CreateWorkspace, create("c2", "acme-studio", "studio"))
    assert_refused(got, ALREADY_EXISTS, "WORKSPACE_EXISTS", "workspace.workspace_id")
    workspaces.CreateWorkspace(create("c3", "new", "studio"), timeout=10)
    for other_content in (create("c3", "new", "creator"), create("c3", "other", "studio")):
        got = refusal(workspaces.CreateWorkspace, other_content)
        assert_refused(got, ALREADY_EXISTS, "REQUEST_ID_REUSED", "request_id")

    got = refusal(workspaces.GetWorkspace, W.GetWorkspaceRequest(workspace_id="nobody"))
    assert_refused(got, NOT_FOUND, "UNKNOWN_WORKSPACE", "workspace_id")
    update = W.UpdateWorkspaceRequest(workspace=ws(workspace_id="nobody"), update_mask=["active"])
    assert_refused(
        refusal(workspaces.UpdateWorkspace, update), NOT_FOUND, "UNKNOWN_WORKSPACE", "workspace.workspace_id"
    )
    update = W.UpdateWorkspaceRequest(workspace=ws(workspace_id="new", plan="gold"), update_mask=["plan"])
    assert_refused(refusal(workspaces.UpdateWorkspace, update), NOT_FOUND, "UNKNOWN_PLAN", "workspace.plan")
    a_day_ago = Timestamp()
    a_day_ago.FromDatetime(datetime.now(UTC) - timedelta(days=1))
    usage = W.GetUsageRequest(workspace_id="nobody", start_time=a_day_ago)
    assert_refused(refusal(workspaces.GetUsage, usage), NOT_FOUND, "UNKNOWN_WORKSPACE", "workspace_id")


# -- CatalogService -----------------------------------------------------------------------


def test_catalog_service_names_every_bad_field_at_once(scheduler: ServiceProcess) -> None:
    with scheduler.channel("backend") as channel:
        catalog = catalog_service_pb2_grpc.CatalogServiceStub(channel)
        for method, request, kind in (
            (catalog.ListPools, F.ListPoolsRequest, "pools"),
            (catalog.ListJobKinds, catalog_service_pb2.ListJobKindsRequest, "kinds"),
            (catalog.ListPlans, catalog_service_pb2.ListPlansRequest, "plans"),
        ):
            got = refusal(method, request(page_size=-1, page_token=OTHER_LISTS_TOKEN))  # type: ignore[operator]
            assert_bad_request(got, PAGING_BOTH_BAD)
            # The list's own kind, but a position that is not an id: refused, not read as "7".
            got = refusal(method, request(page_token=paging.encode(kind, 7)))  # type: ignore[operator]
            assert_bad_request(got, [("page_token", "INVALID_PAGE_TOKEN")])


# -- FleetService ---------------------------------------------------------------------------


def test_fleet_service_names_every_bad_field_at_once(fleet: fleet_service_pb2_grpc.FleetServiceStub) -> None:
    listing = F.ListMachinesRequest(
        page_size=-1, page_token=paging.encode("machines", 7), pool="Not A Pool", state=99
    )
    assert_bad_request(
        refusal(fleet.ListMachines, listing),
        [*PAGING_BOTH_BAD, ("pool", "INVALID_FORMAT"), ("state", "UNKNOWN_VALUE")],
    )
    for method, request in (
        (fleet.CordonMachine, F.CordonMachineRequest),
        (fleet.UncordonMachine, F.UncordonMachineRequest),
        (fleet.DeregisterMachine, F.DeregisterMachineRequest),
    ):
        got = refusal(method, request(machine_id="", request_id="has spaces"))  # type: ignore[operator]
        assert_bad_request(got, [("machine_id", "REQUIRED"), ("request_id", "INVALID_FORMAT")])
    got = refusal(fleet.ListPools, F.ListPoolsRequest(page_size=-1, page_token="!"))
    assert_bad_request(got, PAGING_BOTH_BAD)
    got = refusal(fleet.ListWorkspaces, catalog_pb2.ListWorkspacesRequest(page_size=-1, page_token="!"))
    assert_bad_request(got, PAGING_BOTH_BAD)


def test_fleet_service_says_why_in_error_info(
    fleet: fleet_service_pb2_grpc.FleetServiceStub, sessions: sessionmaker[Session]
) -> None:
    now = datetime.now(UTC)
    got = refusal(fleet.GetMachine, F.GetMachineRequest(machine_id="nobody"))
    assert_refused(got, NOT_FOUND, "UNKNOWN_MACHINE", "machine_id")
    got = refusal(fleet.CordonMachine, F.CordonMachineRequest(machine_id="nobody"))
    assert_refused(got, NOT_FOUND, "UNKNOWN_MACHINE", "machine_id")

    destroyed = add_machine(sessions, now, state="DESTROYED")
    got = refusal(fleet.CordonMachine, F.CordonMachineRequest(machine_id=destroyed))
    assert_refused(got, FAILED_PRECONDITION, "MACHINE_DESTROYED", "machine_id")

    provisioned = add_machine(sessions, now)
    got = refusal(fleet.DeregisterMachine, F.DeregisterMachineRequest(machine_id=provisioned))
    assert_refused(got, FAILED_PRECONDITION, "MACHINE_PROVISIONED", "machine_id")
    box = add_machine(sessions, now, id="box-busy", origin="REGISTERED")
    add_attempt(sessions, now, box)
    got = refusal(fleet.DeregisterMachine, F.DeregisterMachineRequest(machine_id=box))
    assert_refused(got, FAILED_PRECONDITION, "MACHINE_BUSY", "machine_id")
    with sessions() as s:
        assert s.get_one(models.Machine, box).state == "READY"
