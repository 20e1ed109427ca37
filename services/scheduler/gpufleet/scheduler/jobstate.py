"""Every change of a job's state goes through here, so WatchJob sees each one, in order."""

from __future__ import annotations

from datetime import datetime

from gpufleet.common.db import models
from gpufleet.common.db.enums import TERMINAL_JOB_STATES, JobState
from sqlalchemy.orm import Session


def set_job_state(
    session: Session, job: models.Job, state: JobState, now: datetime, message: str = ""
) -> None:
    """Move ``job`` to ``state`` and append the event WatchJob streams."""
    if job.state == state.value and not message:
        return
    job.state = state.value
    job.updated_at = now
    if message:
        job.status_message = message
    if state is JobState.RUNNING and job.started_at is None:
        job.started_at = now
    if state in TERMINAL_JOB_STATES:
        job.ended_at = now
    session.add(models.JobEvent(job_id=job.id, state=state.value, at=now, message=message))


def attempt_charge_micros(slot_seconds: float, machine: models.Machine, plan: models.Plan) -> int:
    """slot-seconds x (machine's hourly price / its slots) x the plan's rate."""
    per_slot_second = machine.hourly_price_micros / max(machine.slots, 1) / 3600.0
    return round(slot_seconds * per_slot_second * plan.rate_micros / 1_000_000)
