"""The waiting jobs' reasons, written inside the assign step's transaction.

A tick writes only the reasons that changed (:func:`~gpufleet.scheduler.tick.pending.changes`):
on PostgreSQL one ``UPDATE ... FROM unnest(...)`` for all of them, whatever their number;
on SQLite (embedded, no round trip) a statement each. A job no longer QUEUED when the
write lands (assigned, cancelled, failed since the snapshot) is left alone: its reason is
shown only while it waits. ``updated_at`` is not touched — it dates the job's state,
and a requeued job's queue wait is counted from it.

A job whose reason itself changed (not only its words or expected time) gets a QUEUED job
event saying why it waits, so WatchJob streams it like any other event: a reason changes a
few times in a job's wait (paused, a machine on its way, ...), never every tick.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, bindparam, text, update

from gpufleet.common.db import models
from gpufleet.common.db.bulk import insert_rows
from gpufleet.common.db.enums import JobState
from gpufleet.scheduler.tick.model import PendingChange

_JOBS = cast(Table, models.Job.__table__)
_EVENTS = cast(Table, models.JobEvent.__table__)

_UPDATE_PG = text(
    "UPDATE jobs SET pending_reason = v.reason, pending_message = v.message, pending_ready_at = v.ready_at"
    " FROM unnest(CAST(:ids AS text[]), CAST(:reasons AS text[]), CAST(:messages AS text[]),"
    " CAST(:ready AS timestamptz[])) AS v(id, reason, message, ready_at)"
    " WHERE jobs.id = v.id AND jobs.state = 'QUEUED' RETURNING jobs.id"
)
_UPDATE_ONE = (
    update(_JOBS)
    .where(_JOBS.c.id == bindparam("job_id"), _JOBS.c.state == JobState.QUEUED.value)
    .values(
        pending_reason=bindparam("reason"),
        pending_message=bindparam("message"),
        pending_ready_at=bindparam("ready_at"),
    )
    .returning(_JOBS.c.id)
)


@dataclass(frozen=True)
class Written:
    """How many reasons were set, cleared, and told to WatchJob as events."""

    set: int = 0
    cleared: int = 0
    events: int = 0


def waiting_message(message: str) -> str:
    """A reason's job event words."""
    return f"waiting: {message}"


def write_pending(conn: Connection, changes: Sequence[PendingChange], now: datetime) -> Written:
    """Write ``changes`` in the caller's transaction (nothing is committed here)."""
    if not changes:
        return Written()
    rows: list[dict[str, Any]] = [
        {
            "job_id": c.job_id,
            "reason": c.pending.reason if c.pending else None,
            "message": c.pending.message if c.pending else None,
            "ready_at": c.pending.ready_at if c.pending else None,
        }
        for c in changes
    ]
    if conn.dialect.name == "postgresql":
        done = set(
            conn.execute(
                _UPDATE_PG,
                {
                    "ids": [r["job_id"] for r in rows],
                    "reasons": [r["reason"] for r in rows],
                    "messages": [r["message"] for r in rows],
                    "ready": [r["ready_at"] for r in rows],
                },
            ).scalars()
        )
    else:
        done = {job_id for r in rows if (job_id := conn.execute(_UPDATE_ONE, r).scalar()) is not None}
    events = [
        {
            "job_id": c.job_id,
            "state": JobState.QUEUED.value,
            "at": now,
            "message": waiting_message(c.pending.message),
        }
        for c in changes
        if c.reason_changed and c.pending is not None and c.job_id in done
    ]
    insert_rows(conn, _EVENTS, events)
    written = [c for c in changes if c.job_id in done]
    cleared = sum(1 for c in written if c.pending is None)
    return Written(set=len(written) - cleared, cleared=cleared, events=len(events))
