"""The request of every call, built once for the sync and the asyncio client alike.

The client checks nothing the server checks: a bad value goes to the scheduler, which names
every bad field at once (:class:`~gpufleet.client.errors.InvalidArgument`). It only fills in
what a caller should not have to think about — the idempotency key of a call that creates
something — and refuses a naive datetime, which no server could read unambiguously.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.v1 import (
    catalog_pb2,
    catalog_service_pb2,
    fleet_service_pb2,
    job_pb2,
    job_service_pb2,
    workspace_service_pb2,
)


def new_request_id() -> str:
    """A fresh idempotency key: one per logical call, reused by every retry of it."""
    return str(uuid.uuid4())


def submit_job(
    workspace: str,
    kind: str,
    *,
    pool: str | None,
    pipeline_version: str | None,
    tenant_values: Mapping[str, str] | None,
    request_id: str | None,
) -> job_service_pb2.SubmitJobRequest:
    """``pool`` and ``pipeline_version`` left out take the kind's catalogue defaults."""
    return job_service_pb2.SubmitJobRequest(
        request_id=new_request_id() if request_id is None else request_id,
        job=job_pb2.Job(
            workspace=workspace,
            kind=kind,
            pool=pool or "",
            pipeline_version=pipeline_version or "",
            tenant_values=dict(tenant_values or {}),
        ),
    )


def get_job(job_id: str) -> job_service_pb2.GetJobRequest:
    return job_service_pb2.GetJobRequest(job_id=job_id)


def list_jobs(
    *,
    workspace: str | None,
    state: job_pb2.JobState | None,
    pool: str | None,
    page_size: int | None,
    page_token: str,
) -> job_service_pb2.ListJobsRequest:
    return job_service_pb2.ListJobsRequest(
        workspace=workspace or "",
        state=state or job_pb2.JOB_STATE_UNSPECIFIED,
        pool=pool or "",
        page_size=page_size or 0,
        page_token=page_token,
    )


def cancel_job(job_id: str, *, reason: str, request_id: str | None) -> job_service_pb2.CancelJobRequest:
    """CancelJob is idempotent by nature: no key is made up for it."""
    return job_service_pb2.CancelJobRequest(job_id=job_id, reason=reason, request_id=request_id or "")


def watch_job(job_id: str, *, after_sequence: int = 0) -> job_service_pb2.WatchJobRequest:
    """``after_sequence``: the last event's sequence a watch already gave (0: from the start)."""
    return job_service_pb2.WatchJobRequest(job_id=job_id, after_sequence=after_sequence)


def get_job_log(
    job_id: str, *, attempt_id: str | None, offset: int, max_bytes: int | None
) -> job_service_pb2.GetJobLogRequest:
    return job_service_pb2.GetJobLogRequest(
        job_id=job_id, attempt_id=attempt_id or "", offset=offset, max_bytes=max_bytes or 0
    )


def create_workspace(
    workspace_id: str, plan: str, *, paused: bool, request_id: str | None
) -> workspace_service_pb2.CreateWorkspaceRequest:
    return workspace_service_pb2.CreateWorkspaceRequest(
        request_id=new_request_id() if request_id is None else request_id,
        workspace=catalog_pb2.Workspace(workspace_id=workspace_id, plan=plan),
        paused=paused,
    )


def get_workspace(workspace_id: str) -> workspace_service_pb2.GetWorkspaceRequest:
    return workspace_service_pb2.GetWorkspaceRequest(workspace_id=workspace_id)


def list_workspaces(*, page_size: int | None, page_token: str) -> catalog_pb2.ListWorkspacesRequest:
    return catalog_pb2.ListWorkspacesRequest(page_size=page_size or 0, page_token=page_token)


def update_workspace(
    workspace_id: str, *, plan: str | None, active: bool | None, request_id: str | None
) -> workspace_service_pb2.UpdateWorkspaceRequest:
    """The mask names exactly what was given: ``active=False`` pauses, ``True`` resumes."""
    mask = [name for name, value in (("plan", plan), ("active", active)) if value is not None]
    return workspace_service_pb2.UpdateWorkspaceRequest(
        workspace=catalog_pb2.Workspace(workspace_id=workspace_id, plan=plan or "", active=bool(active)),
        update_mask=mask,
        request_id=request_id or "",
    )


def get_usage(
    workspace_id: str, *, start: datetime, end: datetime | None
) -> workspace_service_pb2.GetUsageRequest:
    """``end`` left out: until now."""
    request = workspace_service_pb2.GetUsageRequest(workspace_id=workspace_id)
    request.start_time.CopyFrom(timestamp(start, "start"))
    if end is not None:
        request.end_time.CopyFrom(timestamp(end, "end"))
    return request


def list_pools(*, page_size: int | None, page_token: str) -> fleet_service_pb2.ListPoolsRequest:
    return fleet_service_pb2.ListPoolsRequest(page_size=page_size or 0, page_token=page_token)


def list_job_kinds(*, page_size: int | None, page_token: str) -> catalog_service_pb2.ListJobKindsRequest:
    return catalog_service_pb2.ListJobKindsRequest(page_size=page_size or 0, page_token=page_token)


def list_plans(*, page_size: int | None, page_token: str) -> catalog_service_pb2.ListPlansRequest:
    return catalog_service_pb2.ListPlansRequest(page_size=page_size or 0, page_token=page_token)


def timestamp(moment: datetime, name: str) -> Timestamp:
    """A timezone-aware datetime as a Timestamp; a naive one is refused (whose time?)."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name}: a timezone-aware datetime, not a naive one ({moment.isoformat()})")
    out = Timestamp()
    out.FromDatetime(moment)
    return out
