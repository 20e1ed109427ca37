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
from gpufleet.common.errors import AlreadyExists, NotFound
from gpufleet.common.idempotency import optional_request_id, required_request_id
from gpufleet.common.violations import AT_ONCE, Violations
from gpufleet.scheduler.validation import IDENT, MAX_ENTRY_VIOLATIONS, require
from gpufleet.v1 import catalog_pb2, workspace_service_pb2, workspace_service_pb2_grpc

UPDATABLE = ("plan", "active")
# A usage read covers at most this long: a year of days is 366 rows.
MAX_USAGE_SPAN = timedelta(days=366)


def workspace_to_proto(w: models.Workspace) -> catalog_pb2.Workspace:
    return catalog_pb2.Workspace(
        name=f"workspaces/{w.id}", workspace_id=w.id, plan=w.plan_id, active=w.active
    )


def _workspace_id(value: str, field: str, found: Violations) -> str:
    """A workspace id (or its resource name): what SubmitJob accepts as ``job.workspace``."""
    return require(
        value.removeprefix("workspaces/"), field, IDENT, "workspace id (1-64 of a-z 0-9 _ -)", found
    )


def unknown_workspace(workspace_id: str, field: str) -> NotFound:
    return NotFound(f"no workspace {workspace_id!r}", field=field, reason="UNKNOWN_WORKSPACE")


def _plan_given(plan: str, field: str, found: Violations) -> None:
    """A plan is named (whether the catalogue has it is read with the store)."""
    if not plan:
        found.add(field, "is required", "REQUIRED")


def _plan(session: Session, plan: str, field: str) -> str:
    """``plan``, a plan of the catalogue."""
    if len(plan) > 64 or session.get(models.Plan, plan) is None:
        raise NotFound(f"no plan {plan[:64]!r} in the catalogue", field=field, reason="UNKNOWN_PLAN")
    return plan


def list_workspaces(
    sessions: sessionmaker[Session], request: catalog_pb2.ListWorkspacesRequest
) -> catalog_pb2.ListWorkspacesResponse:
    """By id, paged: the backend's WorkspaceService and the operators' FleetService."""
    size, after = paging.keyed_page("workspaces", request.page_size, request.page_token)
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
        found = Violations()
        request_id = required_request_id(request.request_id, found)
        workspace_id = _workspace_id(request.workspace.workspace_id, "workspace.workspace_id", found)
        _plan_given(request.workspace.plan, "workspace.plan", found)
        found.raise_if_any()
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
                        f"request_id {request_id!r} created workspace {by_request.id!r}",
                        field="request_id",
                        reason="REQUEST_ID_REUSED",
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
                        "request_id is being used by another create",
                        field="request_id",
                        reason="REQUEST_ID_REUSED",
                    ) from None
                return self._repeat(existing, request_id, content)

    @staticmethod
    def _repeat(existing: models.Workspace, request_id: str, content: str) -> catalog_pb2.Workspace:
        if existing.request_id != request_id:
            raise AlreadyExists(
                f"workspace {existing.id!r} already exists",
                field="workspace.workspace_id",
                reason="WORKSPACE_EXISTS",
            )
        if existing.request_hash != content:
            raise AlreadyExists(
                f"request_id {request_id!r} created workspace {existing.id!r} with other content",
                field="request_id",
                reason="REQUEST_ID_REUSED",
            )
        return workspace_to_proto(existing)

    def GetWorkspace(
        self, request: workspace_service_pb2.GetWorkspaceRequest, context: grpc.ServicerContext
    ) -> catalog_pb2.Workspace:
        workspace_id = _workspace_id(request.workspace_id, "workspace_id", AT_ONCE)
        with self.sessions() as session:
            row = session.get(models.Workspace, workspace_id)
            if row is None:
                raise unknown_workspace(workspace_id, "workspace_id")
            return workspace_to_proto(row)

    def ListWorkspaces(
        self, request: catalog_pb2.ListWorkspacesRequest, context: grpc.ServicerContext
    ) -> catalog_pb2.ListWorkspacesResponse:
        return list_workspaces(self.sessions, request)

    def UpdateWorkspace(
        self, request: workspace_service_pb2.UpdateWorkspaceRequest, context: grpc.ServicerContext
    ) -> catalog_pb2.Workspace:
        found = Violations()
        workspace_id = _workspace_id(
            request.workspace.workspace_id or request.workspace.name, "workspace.workspace_id", found
        )
        mask = list(request.update_mask)
        if "plan" in mask:
            _plan_given(request.workspace.plan, "workspace.plan", found)
        _update_mask(mask, found)
        optional_request_id(request.request_id, found)
        found.raise_if_any()
        with self.sessions() as session, session.begin():
            row = session.get(models.Workspace, workspace_id, with_for_update=True)
            if row is None:
                raise unknown_workspace(workspace_id, "workspace.workspace_id")
            if "plan" in mask:
                row.plan_id = _plan(session, request.workspace.plan, "workspace.plan")
            if "active" in mask:
                row.active = request.workspace.active
            row.updated_at = self.clock.now()
            return workspace_to_proto(row)

    def GetUsage(
        self, request: workspace_service_pb2.GetUsageRequest, context: grpc.ServicerContext
    ) -> workspace_service_pb2.Usage:
        found = Violations()
        workspace_id = _workspace_id(request.workspace_id, "workspace_id", found)
        start = end = None
        if not request.HasField("start_time"):
            found.add("start_time", "is required", "REQUIRED")
        else:
            start = _time(request.start_time, "start_time", found)
        # Unset: up to now, an attempt that ended this very moment included.
        if request.HasField("end_time"):
            end = _time(request.end_time, "end_time", found)
        else:
            end = self.clock.now() + timedelta(microseconds=1)
        if start is not None and end is not None:
            if end <= start:
                found.add("end_time", "must be after start_time", "OUT_OF_RANGE")
            elif end - start > MAX_USAGE_SPAN:
                found.add("end_time", f"at most {MAX_USAGE_SPAN.days} days after start_time", "OUT_OF_RANGE")
        found.raise_if_any()
        assert start is not None and end is not None  # else refused above
        A, J, M = models.Attempt, models.Job, models.Machine
        with self.sessions() as session:
            if session.get(models.Workspace, workspace_id) is None:
                raise unknown_workspace(workspace_id, "workspace_id")
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


def _time(value: object, field: str, found: Violations) -> datetime | None:
    """A Timestamp as a moment, or None when it is not one (reported into ``found``)."""
    try:
        moment = value.ToDatetime(tzinfo=UTC)  # type: ignore[attr-defined]
    except (ValueError, OverflowError) as exc:
        found.add(field, f"is not a valid time: {exc}", "INVALID_FORMAT")
        return None
    if not isinstance(moment, datetime):
        found.add(field, "is not a valid time", "INVALID_FORMAT")
        return None
    return moment


def _update_mask(mask: list[str], found: Violations) -> None:
    """UpdateWorkspace's mask: at least one path, each one it sets. Every other is named by
    its index (``update_mask[1]``), the first few of them; the rest are counted, so the
    answer stays small whatever the client sent."""
    settable = ", ".join(UPDATABLE)
    if not mask:
        found.add("update_mask", f"name the fields to set: {settable}", "REQUIRED")
    bad = [(i, path) for i, path in enumerate(mask) if path not in UPDATABLE]
    for index, path in bad[:MAX_ENTRY_VIOLATIONS]:
        found.add(f"update_mask[{index}]", f"cannot set {path[:64]!r}; settable: {settable}", "NOT_SETTABLE")
    if len(bad) > MAX_ENTRY_VIOLATIONS:
        found.add(
            "update_mask",
            f"{len(bad) - MAX_ENTRY_VIOLATIONS} more paths it cannot set not listed",
            "NOT_SETTABLE",
        )
