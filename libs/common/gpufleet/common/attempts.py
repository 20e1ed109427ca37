"""Ending the attempts of a machine that was lost, shared by every service that learns of
a loss (DESIGN §6). The decision and the writes are the job lifecycle's
(:mod:`gpufleet.common.job_lifecycle`, :mod:`gpufleet.common.job_writer`).

A lost machine is never the tenant's fault: its live attempts end ``LOST`` and uncharged,
and each job goes back to the queue on its separate, more patient retry budget with a
doubling back-off — ``FAILED`` once that budget is spent, ``CANCELLED`` when a cancel was
already asked for. A machine the cloud took back, or a GPU fault, spends the disruption
budget instead (:mod:`gpufleet.common.job_lifecycle`). The scheduler learns of losses from
leases that run out; the sweeper learns of them from the provider's own list (a pre-empted
spot instance, an instance that vanished). Both write through here so a loss is accounted
for the same way whoever saw it.

Everything here runs inside the caller's transaction (which the caller fences when it is
a leader); nothing here calls a provider or an agent.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.common.db import models
from gpufleet.common.db.enums import LIVE_ATTEMPT_STATES, AttemptState
from gpufleet.common.job_lifecycle import EndCause, Mover, RetryPolicy
from gpufleet.common.job_writer import end_attempt

__all__ = ["LostAttempt", "end_live_attempts_lost", "replacement"]


def replacement(
    cause: EndCause, lost_retry_backoff_s: float, disruption_budget: int
) -> tuple[RetryPolicy, Mover]:
    """How a replaced machine's attempts end: the retry policy their requeues read (the
    writing service's lost-retry back-off and disruption budget) and who ends them (GPU
    health for a GPU fault, else the machine's loss). The writer below and the simulator's
    ledger read it."""
    policy = RetryPolicy(lost_retry_backoff_s=lost_retry_backoff_s, disruption_budget=disruption_budget)
    return policy, Mover.GPU_HEALTH if cause is EndCause.GPU_FAULT else Mover.MACHINE_LOSS


@dataclass(frozen=True)
class LostAttempt:
    """One attempt ended by :func:`end_live_attempts_lost`, and where its job went (from
    ``job_state_before`` to ``job_state``: what the job outcomes are counted from)."""

    attempt_id: str
    job_id: str
    slot_seconds: float
    job_state: str
    kind_id: str
    job_state_before: str
    # LOST for a machine lost; INFRA_ERROR for a GPU fault (ours too, but not a loss).
    attempt_state: str = AttemptState.LOST.value


def end_live_attempts_lost(
    session: Session,
    machine_id: str,
    now: datetime,
    *,
    why: str,
    lost_retry_backoff_s: float,
    disruption_budget: int = RetryPolicy.disruption_budget,
    cause: EndCause = EndCause.MACHINE_LOST,
) -> list[LostAttempt]:
    """End every live attempt on ``machine_id`` by ``cause`` (a machine lost: ``LOST``; a
    GPU fault: ``INFRA_ERROR``), uncharged, and requeue each job (patient budget, doubling
    back-off from ``lost_retry_backoff_s``), through the job lifecycle's one writer.

    The attempt and job rows are locked (``FOR UPDATE`` on PostgreSQL) so a completion
    arriving at the same moment either lands first — and the attempt is no longer live
    here — or waits for this transaction.
    """
    attempts = list(
        session.execute(
            select(models.Attempt)
            .where(
                models.Attempt.machine_id == machine_id,
                models.Attempt.state.in_([s.value for s in LIVE_ATTEMPT_STATES]),
            )
            .order_by(models.Attempt.started_at, models.Attempt.id)
            .with_for_update()
        ).scalars()
    )
    policy, by = replacement(cause, lost_retry_backoff_s, disruption_budget)
    lost: list[LostAttempt] = []
    for attempt in attempts:
        session.execute(
            select(models.Job).where(models.Job.id == attempt.job_id).with_for_update()
        ).scalar_one()
        ended = end_attempt(session, attempt, cause, now, by=by, policy=policy, why=why, message=why)
        job = ended.job
        lost.append(
            LostAttempt(
                attempt.id,
                job.id,
                ended.slot_seconds,
                job.state,
                job.kind_id,
                ended.job_state_before,
                ended.update.attempt_state.value,
            )
        )
    session.flush()
    return lost
