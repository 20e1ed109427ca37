"""Store rows to gpufleet.v1 job messages."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC
from typing import Any

from gpufleet.common.convert import enum_value, ts
from gpufleet.common.db import models
from gpufleet.v1 import job_pb2


def checkpoint_to_proto(c: models.Checkpoint) -> job_pb2.Checkpoint:
    return job_pb2.Checkpoint(
        checkpoint_id=c.id,
        job_id=c.job_id,
        attempt_id=c.attempt_id,
        sequence=c.sequence,
        size_bytes=c.size_bytes,
        sha256=c.sha256,
        create_time=ts(c.created_at),
    )


def attempt_to_proto(
    a: models.Attempt, checkpoints: Mapping[str, models.Checkpoint] | None = None
) -> job_pb2.Attempt:
    started_from = None
    if a.checkpoint_id:
        known = (checkpoints or {}).get(a.checkpoint_id)
        started_from = (
            checkpoint_to_proto(known) if known else job_pb2.Checkpoint(checkpoint_id=a.checkpoint_id)
        )
    return job_pb2.Attempt(
        name=f"jobs/{a.job_id}/attempts/{a.id}",
        attempt_id=a.id,
        job_id=a.job_id,
        machine_id=a.machine_id,
        slot=a.slot,
        state=enum_value(job_pb2.AttemptState, "ATTEMPT_STATE_", a.state),
        start_time=ts(a.started_at),
        end_time=ts(a.ended_at),
        lease_expire_time=ts(a.lease_expires_at),
        slot_seconds=a.slot_seconds,
        charged=a.charged,
        charge_micros=a.charge_micros,
        exit_code=a.exit_code or 0,
        status_message=a.status_message,
        started_from=started_from,
    )


# The job columns a Job message is made of.
_JOB_FIELDS = (
    "id",
    "workspace_id",
    "pool_id",
    "kind_id",
    "pipeline_version",
    "tenant_values",
    "request_id",
    "state",
    "created_at",
    "updated_at",
    "started_at",
    "ended_at",
    "attempt_count",
    "failure_retries_used",
    "lost_retries_used",
    "disruptions_used",
    "status_message",
    "slot_seconds",
    "charge_micros",
    "pending_reason",
    "pending_message",
    "pending_ready_at",
)


# The reasons this build knows (a row written by a newer scheduler may name another: it
# is shown as no reason rather than failing the read).
_REASONS = frozenset(job_pb2.PendingReason.keys())


def job_to_proto(
    j: models.Job,
    attempts: list[models.Attempt] | None = None,
    checkpoints: Mapping[str, models.Checkpoint] | None = None,
) -> job_pb2.Job:
    return job_from_row({f: getattr(j, f) for f in _JOB_FIELDS}, attempts, checkpoints)


def job_from_row(
    row: Mapping[str, Any],
    attempts: list[models.Attempt] | None = None,
    checkpoints: Mapping[str, models.Checkpoint] | None = None,
) -> job_pb2.Job:
    """A Job message from the job's column values (SubmitJob answers from the row it just
    wrote: building an ORM object for it cost about 5 % of the call)."""
    job = job_pb2.Job(
        name=f"jobs/{row['id']}",
        job_id=row["id"],
        workspace=row["workspace_id"],
        pool=row["pool_id"],
        kind=row["kind_id"],
        pipeline_version=row["pipeline_version"],
        tenant_values=row["tenant_values"] or {},
        request_id=row["request_id"],
        state=enum_value(job_pb2.JobState, "JOB_STATE_", row["state"]),
        create_time=ts(row["created_at"]),
        update_time=ts(row["updated_at"]),
        start_time=ts(row.get("started_at")),
        end_time=ts(row.get("ended_at")),
        attempt_count=row["attempt_count"],
        failure_retries_used=row["failure_retries_used"],
        lost_retries_used=row["lost_retries_used"],
        disruptions_used=row.get("disruptions_used") or 0,
        status_message=row["status_message"],
        slot_seconds=row["slot_seconds"],
        charge_micros=row["charge_micros"],
        attempts=[attempt_to_proto(a, checkpoints) for a in (attempts or [])],
    )
    # Why it waits, only while it waits: a job that left the queue another way (cancelled,
    # failed at its deadline) keeps its last reason in the row, unshown.
    reason = row.get("pending_reason")
    if reason and row["state"] == "QUEUED" and f"PENDING_REASON_{reason}" in _REASONS:
        job.pending_reason = enum_value(job_pb2.PendingReason, "PENDING_REASON_", reason)
        job.pending_message = row.get("pending_message") or ""
        ready = row.get("pending_ready_at")
        if ready is not None:
            job.expected_ready_time.FromDatetime(ready.astimezone(UTC))
    return job
