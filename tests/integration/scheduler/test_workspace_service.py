"""WorkspaceService through a real scheduler process, real gRPC and real PostgreSQL: the
product backend creates, changes and pauses workspaces and reads their usage; every bad
input gets the right code naming the field, and nothing is stored."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from sqlalchemy import func, select

from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.v1 import (
    catalog_pb2,
    job_pb2,
    job_service_pb2,
    job_service_pb2_grpc,
    workspace_service_pb2,
    workspace_service_pb2_grpc,
)
from tests.support.fleet_rows import add_machine, job_row
from tests.support.procs import ServiceProcess, start_service

Stub = workspace_service_pb2_grpc.WorkspaceServiceStub
INVALID, MISSING, TAKEN = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
)


@pytest.fixture
def stub(scheduler: ServiceProcess) -> Iterator[Stub]:
    with scheduler.channel("backend") as channel:
        yield Stub(channel)


def create(
    stub: Stub, workspace_id: str, plan: str = "creator", request_id: str = "", **kw: object
) -> object:
    return stub.CreateWorkspace(
        workspace_service_pb2.CreateWorkspaceRequest(
            request_id=request_id or f"create-{workspace_id}",
            workspace=catalog_pb2.Workspace(workspace_id=workspace_id, plan=plan),
            **kw,  # type: ignore[arg-type]
        ),
        timeout=5,
    )


def refused(call, *args: object) -> tuple[grpc.StatusCode, str | None]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as err:
        call(*args, timeout=5)
    field = dict(err.value.trailing_metadata() or ()).get("gpufleet-field")  # type: ignore[attr-defined]
    return err.value.code(), field  # type: ignore[attr-defined]


def workspaces(pg_url: str) -> int:
    with make_sessionmaker(make_engine(pg_url))() as s:
        return int(s.execute(select(func.count()).select_from(models.Workspace)).scalar_one())


def test_create_is_idempotent_listed_and_takes_jobs(stub: Stub, scheduler: ServiceProcess) -> None:
    first = create(stub, "new-studio", plan="studio")
    again = create(stub, "new-studio", plan="studio")
    assert first == again
    assert (first.workspace_id, first.plan, first.active, first.name) == (  # type: ignore[attr-defined]
        "new-studio",
        "studio",
        True,
        "workspaces/new-studio",
    )
    got = stub.GetWorkspace(
        workspace_service_pb2.GetWorkspaceRequest(workspace_id="workspaces/new-studio"), timeout=5
    )
    assert got == first
    listed = stub.ListWorkspaces(catalog_pb2.ListWorkspacesRequest(page_size=2), timeout=5)
    rest = stub.ListWorkspaces(
        catalog_pb2.ListWorkspacesRequest(page_size=2, page_token=listed.next_page_token), timeout=5
    )
    names = [w.workspace_id for w in [*listed.workspaces, *rest.workspaces]]
    assert names == ["acme-studio", "indie-creator", "new-studio"]  # the two seeded by the catalogue
    paused = create(stub, "quiet-one", paused=True)
    assert paused.active is False  # type: ignore[attr-defined]
    with scheduler.channel("backend") as channel:
        job = job_service_pb2_grpc.JobServiceStub(channel).SubmitJob(
            job_service_pb2.SubmitJobRequest(
                request_id="first-job",
                job=job_pb2.Job(
                    workspace="new-studio", pool="l4", kind="short_episode", pipeline_version="v1"
                ),
            ),
            timeout=5,
        )
    assert job.state == job_pb2.JOB_STATE_QUEUED


def test_bad_input_names_its_field_and_stores_nothing(stub: Stub, pg_url: str) -> None:
    before = workspaces(pg_url)
    make = stub.CreateWorkspace
    ws = catalog_pb2.Workspace
    req = workspace_service_pb2.CreateWorkspaceRequest
    cases = [
        (req(workspace=ws(workspace_id="a", plan="studio")), INVALID, "request_id"),
        (
            req(request_id="r1", workspace=ws(plan="studio")),
            INVALID,
            "workspace.workspace_id",
        ),
        (
            req(request_id="r2", workspace=ws(workspace_id="Bad Name!", plan="studio")),
            INVALID,
            "workspace.workspace_id",
        ),
        (
            req(request_id="r3", workspace=ws(workspace_id="x" * 65, plan="studio")),
            INVALID,
            "workspace.workspace_id",
        ),
        (
            req(request_id="r4", workspace=ws(workspace_id="ok")),
            INVALID,
            "workspace.plan",
        ),
        (
            req(request_id="r5", workspace=ws(workspace_id="ok", plan="platinum")),
            MISSING,
            "workspace.plan",
        ),
        (
            req(request_id="r6", workspace=ws(workspace_id="ok", plan="p" * 10_000)),
            MISSING,
            "workspace.plan",
        ),
        # The id is taken: the catalogue seeded it.
        (
            req(request_id="r7", workspace=ws(workspace_id="acme-studio", plan="studio")),
            TAKEN,
            "workspace.workspace_id",
        ),
    ]
    for request, code, field in cases:
        assert refused(make, request) == (code, field), request
    assert workspaces(pg_url) == before
    create(stub, "mine", plan="studio", request_id="same-key")
    # The same request_id with other content, or for another id, is refused.
    assert refused(make, req(request_id="same-key", workspace=ws(workspace_id="mine", plan="creator"))) == (
        TAKEN,
        "request_id",
    )
    assert refused(make, req(request_id="same-key", workspace=ws(workspace_id="other", plan="studio"))) == (
        TAKEN,
        "request_id",
    )
    update = stub.UpdateWorkspace
    upd = workspace_service_pb2.UpdateWorkspaceRequest
    assert refused(update, upd(workspace=ws(workspace_id="mine", plan="creator"))) == (
        INVALID,
        "update_mask",
    )
    # A path it does not set is named by its index in the mask.
    assert refused(update, upd(workspace=ws(workspace_id="mine"), update_mask=["active", "id"])) == (
        INVALID,
        "update_mask[1]",
    )
    assert refused(update, upd(workspace=ws(workspace_id="nobody"), update_mask=["active"])) == (
        MISSING,
        "workspace.workspace_id",
    )
    assert refused(update, upd(workspace=ws(workspace_id="mine", plan="gold"), update_mask=["plan"])) == (
        MISSING,
        "workspace.plan",
    )
    assert (
        stub.GetWorkspace(workspace_service_pb2.GetWorkspaceRequest(workspace_id="mine"), timeout=5).plan
        == "studio"
    )


def test_a_plan_change_and_a_pause_survive_a_restart(pg_url: str, tmp_path: Path) -> None:
    env = {
        "GPUFLEET_DATABASE_URL": pg_url,
        "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:9",
        "GPUFLEET_MAX_RUNNING_MACHINES": "0",
    }
    svc = start_service("scheduler", tmp_path, env)
    try:
        with svc.channel("backend") as channel:
            Stub(channel).UpdateWorkspace(
                workspace_service_pb2.UpdateWorkspaceRequest(
                    workspace=catalog_pb2.Workspace(workspace_id="acme-studio", plan="creator", active=False),
                    update_mask=["plan", "active"],
                ),
                timeout=5,
            )
    finally:
        svc.stop()
    svc = start_service("scheduler", tmp_path, env, tag="-again")
    try:
        with svc.channel("backend") as channel:
            got = Stub(channel).GetWorkspace(
                workspace_service_pb2.GetWorkspaceRequest(workspace_id="acme-studio"), timeout=5
            )
    finally:
        svc.stop()
    assert (got.plan, got.active) == ("creator", False)  # the catalogue file only seeds it


def _ts(moment: datetime) -> Timestamp:
    out = Timestamp()
    out.FromDatetime(moment)
    return out


def test_usage_equals_the_charged_attempts_by_kind_and_day(stub: Stub, pg_url: str) -> None:
    day1 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    sessions = make_sessionmaker(make_engine(pg_url))
    machine = add_machine(sessions, day1, slots=2, gpu_count=1)
    rows = [
        # kind, ended, slot-seconds, slots, charged, charge
        ("short_episode", day1, 1800.0, 1, True, 425_000),
        ("short_episode", day1 + timedelta(days=1), 3600.0, 1, True, 850_000),
        ("film", day1 + timedelta(days=1, hours=2), 7200.0, 2, True, 1_700_001),
        ("short_episode", day1, 900.0, 1, False, 0),  # lost on our side: zero
        ("clip", day1 - timedelta(days=3), 600.0, 1, True, 141_667),  # before the range
    ]
    with sessions() as s, s.begin():
        for n, (kind, ended, slot_s, slots, charged, charge) in enumerate(rows):
            job_id = f"usage-job-{n}"
            s.add(job_row(ended - timedelta(hours=3), id=job_id, kind_id=kind, state="SUCCEEDED"))
            s.flush()
            s.add(
                models.Attempt(
                    id=f"usage-attempt-{n}",
                    job_id=job_id,
                    machine_id=machine,
                    slot=0,
                    slots=slots,
                    state="SUCCEEDED" if charged else "LOST",
                    started_at=ended - timedelta(seconds=slot_s / slots),
                    ended_at=ended,
                    lease_expires_at=ended,
                    slot_seconds=slot_s,
                    charged=charged,
                    charge_micros=charge,
                )
            )
    usage = stub.GetUsage(
        workspace_service_pb2.GetUsageRequest(
            workspace_id="acme-studio",
            start_time=_ts(day1 - timedelta(hours=1)),
            end_time=_ts(day1 + timedelta(days=2)),
        ),
        timeout=5,
    )
    in_range = [r for r in rows if r[4] and day1 - timedelta(hours=1) <= r[1] < day1 + timedelta(days=2)]
    assert usage.total.charge_micros == sum(r[5] for r in in_range) == 2_975_001
    assert usage.total.slot_seconds == 12_600.0 and usage.total.attempts == 3
    assert usage.total.gpu_hours == pytest.approx(12_600.0 / 2 / 3600)  # two slots share one GPU
    assert {k.kind: k.figures.charge_micros for k in usage.by_kind} == {
        "film": 1_700_001,
        "short_episode": 1_275_000,
    }
    assert [(d.day, d.figures.charge_micros) for d in usage.by_day] == [
        ("2026-11-30", 425_000),
        ("2026-12-01", 2_550_001),
    ]
    bad = workspace_service_pb2.GetUsageRequest
    assert refused(stub.GetUsage, bad(workspace_id="acme-studio")) == (
        INVALID,
        "start_time",
    )
    assert refused(
        stub.GetUsage,
        bad(workspace_id="acme-studio", start_time=_ts(day1), end_time=_ts(day1 - timedelta(days=1))),
    ) == (INVALID, "end_time")
    assert refused(stub.GetUsage, bad(workspace_id="nobody", start_time=_ts(day1))) == (
        MISSING,
        "workspace_id",
    )
