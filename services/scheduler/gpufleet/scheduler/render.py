"""Store rows to gpufleet.v1 job messages."""

from __future__ import annotations

from gpufleet.common.convert import enum_value, ts
from gpufleet.common.db import models
from gpufleet.v1 import job_pb2


def attempt_to_proto(a: models.Attempt) -> job_pb2.Attempt:
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
    )


def job_to_proto(j: models.Job, attempts: list[models.Attempt] | None = None) -> job_pb2.Job:
    return job_pb2.Job(
        name=f"jobs/{j.id}",
        job_id=j.id,
        workspace=j.workspace_id,
        pool=j.pool_id,
        kind=j.kind_id,
        pipeline_version=j.pipeline_version,
        tenant_values=j.tenant_values or {},
        request_id=j.request_id,
        state=enum_value(job_pb2.JobState, "JOB_STATE_", j.state),
        create_time=ts(j.created_at),
        update_time=ts(j.updated_at),
        start_time=ts(j.started_at),
        end_time=ts(j.ended_at),
        attempt_count=j.attempt_count,
        failure_retries_used=j.failure_retries_used,
        lost_retries_used=j.lost_retries_used,
        status_message=j.status_message,
        slot_seconds=j.slot_seconds,
        charge_micros=j.charge_micros,
        attempts=[attempt_to_proto(a) for a in (attempts or [])],
    )
