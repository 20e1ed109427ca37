"""The ``sweeps`` table: one row per sweeper pass, what ListSweeps shows an operator."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.convert import ts
from gpufleet.common.db.models import Sweep
from gpufleet.common.loops import TickReport
from gpufleet.v1 import sweeper_service_pb2

INVENTORY_RECONCILE = "INVENTORY_RECONCILE"
ORPHAN_SWEEP = "ORPHAN_SWEEP"


@dataclass
class SweepResult:
    """What one pass saw and did; ``report`` feeds watchdog_stats through the Ticker."""

    started_at: datetime
    instances_seen: int = 0
    machines_updated: int = 0
    orphans_seen: int = 0
    orphans_destroyed: int = 0
    # Provider names that could not be listed this time.
    unreachable: list[str] = field(default_factory=list)
    summary: str = ""
    report: TickReport = field(default_factory=TickReport)


def record(
    sessions: sessionmaker[Session],
    kind: str,
    result: SweepResult,
    ended_at: datetime,
    request_id: str | None = None,
) -> Sweep:
    """Store one finished pass; with a ``request_id`` already used, return that pass instead."""
    row = Sweep(
        kind=kind,
        request_id=request_id,
        started_at=result.started_at,
        ended_at=ended_at,
        instances_seen=result.instances_seen,
        machines_updated=result.machines_updated,
        orphans_seen=result.orphans_seen,
        orphans_destroyed=result.orphans_destroyed,
        unreachable=list(result.unreachable),
        summary=result.summary[:4000],
    )
    try:
        with sessions() as session, session.begin():
            session.add(row)
    except IntegrityError:
        existing = find_by_request(sessions, request_id or "")
        if existing is None:
            raise
        return existing
    return row


def find_by_request(sessions: sessionmaker[Session], request_id: str) -> Sweep | None:
    if not request_id:
        return None
    with sessions() as session:
        return session.execute(select(Sweep).where(Sweep.request_id == request_id)).scalar_one_or_none()


def to_proto(row: Sweep) -> sweeper_service_pb2.Sweep:
    kind = f"SWEEP_KIND_{row.kind}"
    if kind not in sweeper_service_pb2.SweepKind.DESCRIPTOR.values_by_name:
        kind = "SWEEP_KIND_UNSPECIFIED"
    return sweeper_service_pb2.Sweep(
        name=f"sweeps/{row.id}",
        sweep_id=row.id,
        kind=kind,
        start_time=ts(row.started_at),
        end_time=ts(row.ended_at),
        instances_seen=row.instances_seen,
        machines_updated=row.machines_updated,
        orphans_seen=row.orphans_seen,
        orphans_destroyed=row.orphans_destroyed,
        unreachable=[f"PROVIDER_{p}" for p in row.unreachable or []],
        summary=row.summary,
    )
