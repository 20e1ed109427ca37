"""How attempts end and what they cost. Every change of a job's state goes through
``set_job_state`` (shared with the sweeper in ``gpufleet.common.attempts``), so WatchJob
sees each one, in order."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.common.attempts import set_job_state
from gpufleet.common.db import models
from gpufleet.common.db.enums import AttemptState

__all__ = ["attempt_charge_micros", "end_attempt", "set_job_state"]


def attempt_charge_micros(slot_seconds: float, machine: models.Machine, plan: models.Plan) -> int:
    """slot-seconds x (machine's hourly price / its slots) x the plan's rate."""
    per_slot_second = machine.hourly_price_micros / max(machine.slots, 1) / 3600.0
    return round(slot_seconds * per_slot_second * plan.rate_micros / 1_000_000)


def end_attempt(
    session: Session,
    attempt: models.Attempt,
    state: AttemptState,
    now: datetime,
    *,
    slot_seconds: float | None = None,
    charged: bool,
    message: str = "",
    on_machine: bool = False,
) -> None:
    """End ``attempt`` in ``state``: its slot-seconds (measured by the worker, or elapsed
    since it started times the slots it held), its charge when ``charged``, and the job's
    totals. Every way an attempt ends goes through here so a charge is computed once.

    ``on_machine``: the control plane ended it while its process may still run there
    (a cancel, a time limit, a take-back); its slot stays held until the machine's worker
    reports it gone — a slot is free only once the machine says so."""
    job = session.get_one(models.Job, attempt.job_id)
    attempt.state = state.value
    attempt.ended_at = now
    if slot_seconds is None:
        slot_seconds = max(0.0, (now - attempt.started_at).total_seconds()) * attempt.slots
    attempt.slot_seconds = slot_seconds
    attempt.charged = charged
    attempt.holds_slot = on_machine
    attempt.charge_micros = 0
    if message:
        attempt.status_message = message[:2000]
    if charged:
        machine = session.get_one(models.Machine, attempt.machine_id)
        plan = session.execute(
            select(models.Plan)
            .join(models.Workspace, models.Workspace.plan_id == models.Plan.id)
            .where(models.Workspace.id == job.workspace_id)
        ).scalar_one()
        attempt.charge_micros = attempt_charge_micros(slot_seconds, machine, plan)
        job.slot_seconds += slot_seconds
        job.charge_micros += attempt.charge_micros
