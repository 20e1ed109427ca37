"""WorkspaceService: the product backend creates, changes and pauses its workspaces, and
reads what each used and owes.

Plans and job kinds stay in the catalogue file; workspaces are created here (the file only
seeds the ones it names). A paused workspace (``active = false``) keeps its queued jobs
waiting — the fleet tick reads only active workspaces' queue — and lets its running ones
finish. Usage is read from the attempts themselves, so it agrees to the micro with what
each attempt was charged: an attempt not charged (lost, held or failed on our side) counts
zero in every figure.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import grpc
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import paging
from gpufleet.common.clock import Clock
from gpufleet.common.convert import ts
from gpufleet.common.db import models
from gpufleet.common.errors import AlreadyExists, InvalidArgument, NotFound
from gpufleet.common.idempotency import optional_request_id, required_request_id
from gpufleet.scheduler.validation import IDENT, require
from gpufleet.v1 import catalog_pb2, workspace_service_pb2, workspace_service_pb2_grpc

UPDATABLE = ("plan", "active")
# A usage read covers at most this long: a year of days is 366 rows.
MAX_USAGE_SPAN = timedelta(days=366)


def workspace_to_proto(w: models.Workspace) -> catalog_pb2.Workspace:
    return catalog_pb2.Workspace(
        name=f"workspaces/{w.id}", workspace_id=w.id, plan=w.plan_id, active=w.active
    )


def _workspace_id(value: str, field: str) -> str:
    """A workspace id (or its resource name): what SubmitJob accepts as ``job.workspace``."""
    return require(value.removeprefix("workspaces/"), field, IDENT, "workspace id (1-64 of a-z 0-9 _ -)")


def _plan(session: Session, plan: str, field: str) -> str:
    if not plan:
        raise InvalidArgument("is required", field=field)
    if len(plan) > 64 or session.get(models.Plan, plan) is None:
        raise NotFound(f"no plan {plan[:64]!r} in the catalogue", field=field)
    return plan


def list_workspaces(
    sessions: sessionmaker[Session], request: catalog_pb2.ListWorkspacesRequest
) -> catalog_pb2.ListWorkspacesResponse:
    """By id, paged: the backend's WorkspaceService and the operators' FleetService."""
    size = paging.page_size(request.page_size)
    after = paging.decode_str("workspaces", request.page_token) or ""
    with sessions() as session:
        rows = list(
            session.execute(
                select(models.Workspace)
                .where(models.Workspace.id > after)
                .order_by(models.Workspace.id)
                .limit(size + 1)
            ).scalars()
        )
    more = len(rows) > size
    rows = rows[:size]
    return catalog_pb2.ListWorkspacesResponse(
        workspaces=[workspace_to_proto(w) for w in rows],
        next_page_token=paging.encode("workspaces", rows[-1].id) if more else "",
    )


@dataclass
class _Figures:
    slot_seconds: float = 0.0
    gpu_hours: float = 0.0
    charge_micros: int = 0
    attempts: int = 0

    def add(self, slot_seconds: float, gpu_hours: float, charge_micros: int) -> None:
        self.slot_seconds += slot_seconds
        self.gpu_hours += gpu_hours
        self.charge_micros += charge_micros
        self.attempts += 1

    def proto(self) -> workspace_service_pb2.UsageFigures:
        return workspace_service_pb2.UsageFigures(
            slot_seconds=self.slot_seconds,
            gpu_hours=self.gpu_hours,
            charge_micros=self.charge_micros,
            attempts=self.attempts,
        )


class WorkspaceService(workspace_service_pb2_grpc.WorkspaceServiceServicer):  # type: ignore[misc]
    def __init__(self, sessions: sessionmaker[Session], clock: Clock) -> None:
        self.sessions = sessions
        self.clock = clock

    def CreateWorkspace(
        self, request: workspace_service_pb2.CreateWorkspaceRequest, context: grpc.ServicerContext
    ) -> catalog_pb2.Workspace:
        request_id = required_request_id(request.request_id)
        workspace_id = _workspace_id(request.workspace.workspace_id, "workspace.workspace_id")
        active = not request.paused
        content = hashlib.sha256(f"{workspace_id}\0{request.workspace.plan}\0{active}".encode()).hexdigest()
        now = self.clock.now()
        try:
            with self.sessions() as session, session.begin():
                plan = _plan(session, request.workspace.plan, "workspace.plan")
                existing = session.get(models.Workspace, workspace_id)
                if existing is not None:
                    return self._repeat(existing, request_id, content)
                by_request = session.execute(
                    select(models.Workspace).where(models.Workspace.request_id == request_id)
                ).scalar_one_or_none()
                if by_request is not None:
                    raise AlreadyExists(
                        f"request_id {request_id!r} created workspace {by_request.id!r}", field="request_id"
                    )
                row = models.Workspace(
                    id=workspace_id,
                    plan_id=plan,
                    active=active,
                    request_id=request_id,
                    request_hash=content,
                    created_at=now,
                    updated_at=now,
                )
                session.add(row)
                session.flush()
                return workspace_to_proto(row)
        except IntegrityError:
            # Two creates raced on the id or the request_id: answer as the winner did.
            with self.sessions() as session:
                existing = session.get(models.Workspace, workspace_id)
                if existing is None:
                    raise AlreadyExists(
                        "request_id is being used by another create", field="request_id"
                    ) from None
                return self._repeat(existing, request_id, content)

    @staticmethod
    def _repeat(existing: models.Workspace, request_id: str, content: str) -> catalog_pb2.Workspace:
        if existing.request_id != request_id:
            raise AlreadyExists(f"workspace {existing.id!r} already exists", field="workspace.workspace_id")
        if existing.request_hash != content:
            raise AlreadyExists(
                f"request_id {request_id!r} created workspace {existing.id!r} with other content",
                field="request_id",
            )
        return workspace_to_proto(existing)

    def GetWorkspace(
        self, request: workspace_service_pb2.GetWorkspaceRequest, context: grpc.ServicerContext
    ) -> catalog_pb2.Workspace:
        workspace_id = _workspace_id(request.workspace_id, "workspace_id")
        with self.sessions() as session:
            row = session.get(models.Workspace, workspace_id)
            if row is None:
                raise NotFound(f"no workspace {workspace_id!r}", field="workspace_id")
            return workspace_to_proto(row)

    def ListWorkspaces(
        self, request: catalog_pb2.ListWorkspacesRequest, context: grpc.ServicerContext
    ) -> catalog_pb2.ListWorkspacesResponse:
        return list_workspaces(self.sessions, request)

    def UpdateWorkspace(
        self, request: workspace_service_pb2.UpdateWorkspaceRequest, context: grpc.ServicerContext
    ) -> catalog_pb2.Workspace:
        optional_request_id(request.request_id)
        workspace_id = _workspace_id(
            request.workspace.workspace_id or request.workspace.name, "workspace.workspace_id"
        )
        mask = list(request.update_mask)
        if not mask:
            raise InvalidArgument(f"name the fields to set: {', '.join(UPDATABLE)}", field="update_mask")
        unknown = [f for f in mask if f not in UPDATABLE]
        if unknown:
            raise InvalidArgument(
                f"cannot set {unknown[0][:64]!r}; settable: {', '.join(UPDATABLE)}", field="update_mask"
            )
        with self.sessions() as session, session.begin():
            row = session.get(models.Workspace, workspace_id, with_for_update=True)
            if row is None:
                raise NotFound(f"no workspace {workspace_id!r}", field="workspace.workspace_id")
            if "plan" in mask:
                row.plan_id = _plan(session, request.workspace.plan, "workspace.plan")
            if "active" in mask:
                row.active = request.workspace.active
            row.updated_at = self.clock.now()
            return workspace_to_proto(row)

    def GetUsage(
        self, request: workspace_service_pb2.GetUsageRequest, context: grpc.ServicerContext
    ) -> workspace_service_pb2.Usage:
        workspace_id = _workspace_id(request.workspace_id, "workspace_id")
        if not request.HasField("start_time"):
            raise InvalidArgument("is required", field="start_time")
        start = _time(request.start_time, "start_time")
        # Unset: up to now, an attempt that ended this very moment included.
        if request.HasField("end_time"):
            end = _time(request.end_time, "end_time")
        else:
            end = self.clock.now() + timedelta(microseconds=1)
        if end <= start:
            raise InvalidArgument("must be after start_time", field="end_time")
        if end - start > MAX_USAGE_SPAN:
            raise InvalidArgument(f"at most {MAX_USAGE_SPAN.days} days after start_time", field="end_time")
        A, J, M = models.Attempt, models.Job, models.Machine
        with self.sessions() as session:
            if session.get(models.Workspace, workspace_id) is None:
                raise NotFound(f"no workspace {workspace_id!r}", field="workspace_id")
            rows = session.execute(
                select(J.kind_id, A.ended_at, A.slot_seconds, A.slots, A.charge_micros, M.gpu_count, M.slots)
                .join(J, J.id == A.job_id)
                .join(M, M.id == A.machine_id)
                .where(
                    J.workspace_id == workspace_id,
                    A.charged.is_(True),
                    A.ended_at >= start,
                    A.ended_at < end,
                )
            ).all()
        total = _Figures()
        by_kind: dict[str, _Figures] = defaultdict(_Figures)
        by_day: dict[str, _Figures] = defaultdict(_Figures)
        for kind, ended_at, slot_seconds, _slots, charge, gpu_count, machine_slots in rows:
            # A slot's share of the machine's GPUs: a film holding every slot is every GPU.
            gpu_hours = slot_seconds / max(machine_slots, 1) * gpu_count / 3600.0
            day = ended_at.astimezone(UTC).date().isoformat() if ended_at is not None else ""
            for figures in (total, by_kind[kind], by_day[day]):
                figures.add(slot_seconds, gpu_hours, int(charge))
        return workspace_service_pb2.Usage(
            workspace_id=workspace_id,
            start_time=ts(start),
            end_time=ts(end),
            total=total.proto(),
            by_kind=[
                workspace_service_pb2.UsageByKind(kind=k, figures=f.proto())
                for k, f in sorted(by_kind.items())
            ],
            by_day=[
                workspace_service_pb2.UsageByDay(day=d, figures=f.proto()) for d, f in sorted(by_day.items())
            ],
        )


def _time(value: object, field: str) -> datetime:
    try:
        moment = value.ToDatetime(tzinfo=UTC)  # type: ignore[attr-defined]
    except (ValueError, OverflowError) as exc:
        raise InvalidArgument(f"is not a valid time: {exc}", field=field) from None
    if not isinstance(moment, datetime):
        raise InvalidArgument("is not a valid time", field=field)
    return moment
