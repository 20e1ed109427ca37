"""The job and attempt lifecycle: every allowed move of a job's or an attempt's state, who
may make it, and the one pure decision of what an ended attempt does to its job.

Beside the machine's (:mod:`gpufleet.common.lifecycle`). Before this module the rule "an
attempt ended like this, so its job goes there" was written out by each writer — the
worker's completion, the time limits, the lease expiry, the dispatch take-back, the
machine-loss path and the simulator — and the copies had drifted. Now an attempt's end has
a :class:`EndCause`; :data:`END_RULES` says for each cause what the attempt becomes,
whether it is charged, which way its job goes and who may end an attempt so; and
:func:`decide_attempt_end` turns a cause and the job's counters into one frozen
:class:`JobUpdate`. The SQL writer (:mod:`gpufleet.common.job_writer`) and the simulator
apply that same object.

Three retry budgets (DESIGN §6, and Kubernetes' pod failure policy, whose ``Ignore``
rule keeps a disruption off a Job's ``backoffLimit``):

- *ordinary* — the tenant's own failure (a non-zero exit): charged, spends the kind's
  ``retry_budget``, back in the queue after a fixed ``retry_backoff_s``;
- *patient* — our failure that the job might still have caused (the machine went dark —
  its lease ran out and its agent answered no probe either, its worker fell silent, it
  stopped itself — or its pipeline could not be started): never charged, spends the
  separate ``lost_retry_budget``, back-off doubling with each such failure. A job that
  brings down every machine it lands on must end, not roam the fleet;
- *disruption* — our failure that the job cannot have caused, because the platform knows
  its own reason: the job never started (a dispatch taken back, walls that could not be
  built), the lease ran out while the machine's agent still answered (its worker died),
  the GPU reported a hardware fault, the cloud took the machine back (pre-empted,
  spot-stopped, gone from its list), or the platform stopped a job that was running well
  (the machine's lease fence, the machine stopping, its runner found dead, a kill the
  agent announced). Never
  charged, never spends the patient budget — a soak that restarts the database every
  minute must not fail a tenant's job — and spends only ``disruption_budget``, a wide
  bound against a loop (a machine that refuses every start), after a fixed back-off.

A job already final stays final whatever an attempt's end says; a job whose cancel was
asked for is cancelled rather than requeued. Nothing here touches a database: the module
is imported by the simulator and by every service.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from gpufleet.common.db.enums import (
    LIVE_ATTEMPT_STATES,
    TERMINAL_JOB_STATES,
    AttemptState,
    JobState,
    LedgerOutcome,
)
from gpufleet.common.errors import GpufleetError

J = JobState
AS = AttemptState


class Mover(StrEnum):
    """Who moves jobs and attempts."""

    WORKER = "worker"  # the machine's worker reporting (WorkerService: heartbeat, completion)
    DISPATCH = "dispatch"  # the fleet tick's assign, its StartJob answer, its take-back
    LIMITS = "limits"  # the fleet tick: an attempt past its kind's time limit
    LEASE_EXPIRY = "lease_expiry"  # the fleet tick: an attempt whose lease ran out
    CANCEL = "cancel"  # a tenant's CancelJob
    REQUEST_WATCHDOG = "request_watchdog"  # queue wait, no consumer, stuck dispatch
    MACHINE_LOSS = "machine_loss"  # the ledger's REPLACE_MACHINE (reaper nets, sweeper)
    GPU_HEALTH = "gpu_health"  # a critical GPU fault on the attempt's machine (#27)


M = Mover


class JobEffect(StrEnum):
    """Which way an ended attempt sends its job."""

    SUCCEED = "succeed"
    CANCEL = "cancel"
    TIME_OUT = "time_out"
    RETRY_ORDINARY = "retry_ordinary"  # the tenant's failure: FAILED once the budget is spent
    RETRY_PATIENT = "retry_patient"  # our failure: FAILED once the patient budget is spent
    RETRY_DISRUPTED = "retry_disrupted"  # ours, not the job's doing: the disruption budget


class Backoff(StrEnum):
    """Where a requeued job's ``not_before`` comes from (today's numbers, per path)."""

    FIXED_RETRY = "fixed_retry"  # now + retry_backoff_s
    DOUBLING_LOST = "doubling_lost"  # now + lost_retry_backoff_s * 2^(n-1)
    DOUBLING_RETRY = "doubling_retry"  # now + retry_backoff_s * 2^(n-1): a dispatch taken back
    FIXED_LOST = "fixed_lost"  # now + lost_retry_backoff_s: a disruption (not the job's doing)


class EndCause(StrEnum):
    """Why an attempt ended."""

    SUCCEEDED = "succeeded"  # the worker: exit 0
    JOB_FAILED = "job_failed"  # the worker: the job's own death (non-zero exit, OOM kill)
    RUNNER_TIMED_OUT = "runner_timed_out"  # the worker: its runner stopped it at the limit
    RUNNER_CANCELLED = "runner_cancelled"  # the worker: its runner stopped it for a cancel
    INFRA_ERROR = "infra_error"  # the worker: it could not be started (no pipeline, ...)
    DISRUPTED = "disrupted"  # the worker: the platform stopped a job running well (fence, ...)
    SLOT_NOT_CLOSED = "slot_not_closed"  # the worker: the slot's walls could not be built
    TIME_LIMIT = "time_limit"  # the fleet tick: past its kind's time limit
    LEASE_EXPIRED = "lease_expired"  # the fleet tick: its lease ran out, the machine dark
    WORKER_LOST = "worker_lost"  # the fleet tick: its lease ran out, the machine's agent up
    TAKEN_BACK = "taken_back"  # the dispatch: StartJob failed or never answered
    CANCEL_REQUESTED = "cancel_requested"  # the tenant's CancelJob
    MACHINE_LOST = "machine_lost"  # the ledger replaced its machine
    RECLAIMED = "reclaimed"  # the cloud took its machine back (pre-empted, spot-stopped, gone)
    GPU_FAULT = "gpu_fault"  # a critical GPU fault on its machine (Xid 79, ECC, ...)


C = EndCause


@dataclass(frozen=True)
class EndRule:
    """What one cause does: the attempt's end state, its charge, its job's way, where a
    requeue's back-off comes from, the ledger class the writer records (None: none, or
    the caller's own row, as for a machine replaced), who may end an attempt so, and
    whether its slots stay held.

    ``holds_slot``: the control plane ended it while its process may still run on the
    machine (a time limit, a lease run out, a take-back, a cancel, a GPU fault): the
    process is told to stop and its slots stay busy until the machine's worker reports it
    gone (a heartbeat that no longer lists it, or its completion), so no job is placed
    beside a process that has not let go — and the GPU-fault net gives its runner's stop
    ``slot_release_wait`` before the destroy. The worker's own reports end a process that
    is gone already; a machine the cloud took back or the ledger replaces runs nothing
    the platform will place work beside."""

    attempt_state: AttemptState
    charged: bool
    job: JobEffect
    backoff: Backoff | None
    ledger_class: str | None
    by: frozenset[Mover]
    holds_slot: bool = False


def _rule(
    state: AttemptState,
    charged: bool,
    job: JobEffect,
    backoff: Backoff | None,
    ledger_class: str | None,
    *by: Mover,
    holds_slot: bool = False,
) -> EndRule:
    return EndRule(state, charged, job, backoff, ledger_class, frozenset(by), holds_slot)


_E = JobEffect
_B = Backoff

END_RULES: dict[EndCause, EndRule] = {
    C.SUCCEEDED: _rule(AS.SUCCEEDED, True, _E.SUCCEED, None, None, M.WORKER),
    C.JOB_FAILED: _rule(AS.FAILED, True, _E.RETRY_ORDINARY, _B.FIXED_RETRY, "job_failed", M.WORKER),
    C.RUNNER_TIMED_OUT: _rule(AS.TIMED_OUT, True, _E.TIME_OUT, None, "job_timed_out", M.WORKER),
    C.RUNNER_CANCELLED: _rule(AS.CANCELLED, True, _E.CANCEL, None, None, M.WORKER),
    C.INFRA_ERROR: _rule(
        AS.INFRA_ERROR, False, _E.RETRY_PATIENT, _B.DOUBLING_LOST, "job_infra_error", M.WORKER
    ),
    C.DISRUPTED: _rule(AS.INFRA_ERROR, False, _E.RETRY_DISRUPTED, _B.FIXED_LOST, "job_infra_error", M.WORKER),
    C.SLOT_NOT_CLOSED: _rule(
        AS.INFRA_ERROR, False, _E.RETRY_DISRUPTED, _B.FIXED_LOST, "slot_could_not_be_closed", M.WORKER
    ),
    C.TIME_LIMIT: _rule(AS.TIMED_OUT, True, _E.TIME_OUT, None, "job_timed_out", M.LIMITS, holds_slot=True),
    C.LEASE_EXPIRED: _rule(
        AS.LOST, False, _E.RETRY_PATIENT, _B.DOUBLING_LOST, "lease_expired", M.LEASE_EXPIRY, holds_slot=True
    ),
    C.WORKER_LOST: _rule(
        AS.LOST, False, _E.RETRY_DISRUPTED, _B.FIXED_LOST, "lease_expired", M.LEASE_EXPIRY, holds_slot=True
    ),
    C.TAKEN_BACK: _rule(
        AS.INFRA_ERROR,
        False,
        _E.RETRY_DISRUPTED,
        _B.DOUBLING_RETRY,
        "job_infra_error",
        M.DISPATCH,
        holds_slot=True,
    ),
    C.CANCEL_REQUESTED: _rule(AS.CANCELLED, True, _E.CANCEL, None, None, M.CANCEL, holds_slot=True),
    C.MACHINE_LOST: _rule(AS.LOST, False, _E.RETRY_PATIENT, _B.DOUBLING_LOST, None, M.MACHINE_LOSS),
    C.RECLAIMED: _rule(AS.LOST, False, _E.RETRY_DISRUPTED, _B.FIXED_LOST, None, M.MACHINE_LOSS),
    C.GPU_FAULT: _rule(
        AS.INFRA_ERROR,
        False,
        _E.RETRY_DISRUPTED,
        _B.FIXED_LOST,
        None,
        M.GPU_HEALTH,
        M.MACHINE_LOSS,
        holds_slot=True,
    ),
}

# The job moves a request watchdog makes, none after an attempt: the ledger class it records
# -> (from, to). A stuck dispatch goes back to the queue with no retry spent.
REQUEST_WATCHDOG_MOVES: dict[str, tuple[JobState, JobState]] = {
    "queue_wait_timeout": (J.QUEUED, J.FAILED),
    "no_consumer": (J.QUEUED, J.FAILED),
    "dispatch_stuck": (J.DISPATCHING, J.QUEUED),
}

# What the ledger's route of a class recorded for a job's move must say
# (:data:`gpufleet.common.ledger.ROUTES`; a test holds the two tables together): the job
# ended whatever its budget (FAIL_JOB), back to the queue on a budget, FAILED once spent
# (RETRY_SAME_MACHINE — any machine, despite the wire name), or nothing decided by the
# ledger (a reset that spends no retry).
LEDGER_ROUTE_OF_EFFECT: dict[JobEffect, LedgerOutcome] = {
    JobEffect.TIME_OUT: LedgerOutcome.FAIL_JOB,
    JobEffect.RETRY_ORDINARY: LedgerOutcome.RETRY_SAME_MACHINE,
    JobEffect.RETRY_PATIENT: LedgerOutcome.RETRY_SAME_MACHINE,
    JobEffect.RETRY_DISRUPTED: LedgerOutcome.RETRY_SAME_MACHINE,
}
LEDGER_ROUTE_OF_WATCHDOG_MOVE: dict[JobState, LedgerOutcome] = {
    J.FAILED: LedgerOutcome.FAIL_JOB,
    J.QUEUED: LedgerOutcome.NOTHING,
}

# The causes that are our failure: never charged, retried on the patient or the disruption
# budget; and those of them the job cannot have caused.
OUR_FAILURES = frozenset(
    c for c, r in END_RULES.items() if r.job in (JobEffect.RETRY_PATIENT, JobEffect.RETRY_DISRUPTED)
)
DISRUPTIONS = frozenset(c for c, r in END_RULES.items() if r.job is JobEffect.RETRY_DISRUPTED)

# The attempt states that are never charged (and those always charged): what a check of
# the charges after the fact reads — an attempt's state says which, whoever ended it.
UNCHARGED_ATTEMPT_STATES = frozenset(r.attempt_state for r in END_RULES.values() if not r.charged)
CHARGED_ATTEMPT_STATES = frozenset(r.attempt_state for r in END_RULES.values() if r.charged)

# What a job's status message says when the caller gives no words of its own.
_WORDS: dict[EndCause, str] = {
    C.SUCCEEDED: "succeeded",
    C.RUNNER_TIMED_OUT: "timed out",
    C.RUNNER_CANCELLED: "cancelled",
    C.INFRA_ERROR: "infrastructure error",
    C.DISRUPTED: "stopped by the platform",
    C.SLOT_NOT_CLOSED: "infrastructure error",
    C.TIME_LIMIT: "stopped: past its kind's time limit",
    C.LEASE_EXPIRED: "machine lost (lease expired)",
    C.WORKER_LOST: "lease expired while the machine still answered: its worker or our path to it failed",
    C.TAKEN_BACK: "could not start on the machine",
    C.CANCEL_REQUESTED: "cancelled",
    C.MACHINE_LOST: "machine lost",
    C.RECLAIMED: "machine taken back by the cloud",
    C.GPU_FAULT: "GPU fault on its machine",
}

_JOB_STATE = {
    JobEffect.SUCCEED: J.SUCCEEDED,
    JobEffect.CANCEL: J.CANCELLED,
    JobEffect.TIME_OUT: J.TIMED_OUT,
}

_ACTIVE = (J.DISPATCHING, J.RUNNING)

# A start that keeps failing backs off 2^5 times its first wait at most (320 s by default).
_MAX_DOUBLINGS = 5


def _job_moves() -> dict[tuple[JobState, JobState], frozenset[Mover]]:
    """The job table: the starts and request watchdogs written out, every attempt end's
    move derived from :data:`END_RULES` (so the two can never disagree)."""
    moves: dict[tuple[JobState, JobState], set[Mover]] = {
        (J.QUEUED, J.DISPATCHING): {M.DISPATCH},
        # StartJob answered; or the worker's heartbeat says the attempt runs.
        (J.DISPATCHING, J.RUNNING): {M.DISPATCH, M.WORKER},
        (J.QUEUED, J.CANCELLED): {M.CANCEL},
    }
    for move in REQUEST_WATCHDOG_MOVES.values():
        moves.setdefault(move, set()).add(M.REQUEST_WATCHDOG)
    for rule in END_RULES.values():
        # A requeue may end QUEUED, FAILED once spent, or CANCELLED when a cancel was asked for.
        requeue = [J.QUEUED, J.FAILED, J.CANCELLED]
        targets = [_JOB_STATE[rule.job]] if rule.job in _JOB_STATE else requeue
        for src in _ACTIVE:
            for dst in targets:
                moves.setdefault((src, dst), set()).update(rule.by)
    return {k: frozenset(v) for k, v in moves.items()}


JOB_TRANSITIONS: dict[tuple[JobState, JobState], frozenset[Mover]] = _job_moves()


def _attempt_moves() -> dict[tuple[AttemptState, AttemptState], frozenset[Mover]]:
    moves: dict[tuple[AttemptState, AttemptState], set[Mover]] = {
        (AS.STARTING, AS.RUNNING): {M.DISPATCH, M.WORKER},
    }
    for rule in END_RULES.values():
        for src in LIVE_ATTEMPT_STATES:
            moves.setdefault((src, rule.attempt_state), set()).update(rule.by)
    return {k: frozenset(v) for k, v in moves.items()}


ATTEMPT_TRANSITIONS: dict[tuple[AttemptState, AttemptState], frozenset[Mover]] = _attempt_moves()


class IllegalJobTransition(GpufleetError):
    """A move the job lifecycle does not allow: a bug in the caller, never input."""


def check_job_move(from_: JobState, to: JobState, by: Mover) -> None:
    if by not in JOB_TRANSITIONS.get((from_, to), frozenset()):
        raise IllegalJobTransition(f"{by.value} may not move a job from {from_.value} to {to.value}")


def check_attempt_move(from_: AttemptState, to: AttemptState, by: Mover) -> None:
    if by not in ATTEMPT_TRANSITIONS.get((from_, to), frozenset()):
        raise IllegalJobTransition(f"{by.value} may not move an attempt from {from_.value} to {to.value}")


def check_cause(cause: EndCause, by: Mover) -> EndRule:
    """The cause's rule, once ``by`` is known to be allowed to end an attempt so."""
    rule = END_RULES[cause]
    if by not in rule.by:
        raise IllegalJobTransition(f"{by.value} may not end an attempt as {cause.value}")
    return rule


@dataclass(frozen=True)
class RetryPolicy:
    """The back-offs of a requeue: the scheduler's ``retry_backoff_s`` and the shared
    ``lost_retry_backoff_s`` (:class:`~gpufleet.common.outcome_policy.OutcomePolicy`)."""

    retry_backoff_s: float = 10.0
    lost_retry_backoff_s: float = 30.0
    # Disruptions (ends the job cannot have caused) a job may ride out before it is FAILED:
    # a bound against a loop, not a judgement of the job.
    disruption_budget: int = 20


@dataclass(frozen=True)
class JobCounters:
    """What the decision reads of the job: plain values, as the row or the simulator has them."""

    state: JobState
    failure_retries_used: int
    lost_retries_used: int
    retry_budget: int
    lost_retry_budget: int
    cancel_requested: bool = False
    disruptions_used: int = 0


@dataclass(frozen=True)
class JobUpdate:
    """What an ended attempt does, to be applied as one: the attempt's end state and
    charge, and the job's next state and counters (``job_state`` None: the job was already
    final and does not move). ``backoff_s``: the job's ``not_before`` is now plus this
    (None: left alone). ``holds_slot``: the attempt's slots stay busy until its machine's
    worker reports its process gone (:class:`EndRule`)."""

    cause: EndCause
    attempt_state: AttemptState
    charged: bool
    job_state: JobState | None
    failure_retries_used: int
    lost_retries_used: int
    backoff_s: float | None
    message: str
    ledger_class: str | None
    disruptions_used: int = 0
    holds_slot: bool = False

    @property
    def requeued(self) -> bool:
        return self.job_state is JobState.QUEUED

    @property
    def lost(self) -> bool:
        return self.attempt_state is AttemptState.LOST


def charge_micros(slot_seconds: float, hourly_price_micros: int, slots: int, rate_micros: int) -> int:
    """A charged attempt's price: its slot-seconds x (the machine's hourly price / its
    slots) x the plan's rate (``rate_micros`` per 1,000,000: 1.2x is 1_200_000). One
    rule for the worker's end of an attempt and for the simulator's month."""
    per_slot_second = hourly_price_micros / max(slots, 1) / 3600.0
    return round(slot_seconds * per_slot_second * rate_micros / 1_000_000)


def decide_attempt_end(
    cause: EndCause, job: JobCounters, policy: RetryPolicy, *, why: str = "", exit_code: int = 0
) -> JobUpdate:
    """What an attempt's end by ``cause`` does to it and to its job.

    ``why``: the job's status words for the end (a cancel's reason, a replaced machine's
    class); the cause's own words when empty. ``exit_code`` names a tenant's failure.
    """
    rule = END_RULES[cause]
    words = why or _WORDS.get(cause, cause.value)
    failures, losses, disruptions = job.failure_retries_used, job.lost_retries_used, job.disruptions_used
    backoff: float | None = None
    to: JobState | None
    if job.state in TERMINAL_JOB_STATES:
        to, message = None, ""
    elif rule.job in _JOB_STATE:
        to, message = _JOB_STATE[rule.job], words
    elif job.cancel_requested:
        to, message = J.CANCELLED, "cancelled"
    elif rule.job is JobEffect.RETRY_ORDINARY:
        if failures < job.retry_budget:
            failures += 1
            to, backoff = J.QUEUED, policy.retry_backoff_s
            message = f"attempt failed (exit {exit_code}); retry {failures} of {job.retry_budget}"
        else:
            to, message = J.FAILED, f"failed (exit {exit_code}); retry budget spent"
    elif rule.job is JobEffect.RETRY_DISRUPTED:
        if disruptions < policy.disruption_budget:
            disruptions += 1
            to = J.QUEUED
            if rule.backoff is Backoff.DOUBLING_RETRY:  # a start that failed: it may fail again
                backoff = policy.retry_backoff_s * (2 ** (min(disruptions, _MAX_DOUBLINGS + 1) - 1))
            else:
                backoff = policy.lost_retry_backoff_s
            message = (
                f"{words}; requeued (disruption {disruptions} of {policy.disruption_budget}, "
                f"not counted against its retries), not charged"
            )
        else:
            to, message = J.FAILED, f"{words}; disruption budget spent"
    elif losses < job.lost_retry_budget:
        losses += 1
        base = (
            policy.retry_backoff_s if rule.backoff is Backoff.DOUBLING_RETRY else policy.lost_retry_backoff_s
        )
        to, backoff = J.QUEUED, base * (2 ** (losses - 1))
        message = f"{words}; requeued ({losses} of {job.lost_retry_budget}), not charged"
    else:
        to, message = J.FAILED, f"{words}; lost-retry budget spent"
    return JobUpdate(
        cause=cause,
        attempt_state=rule.attempt_state,
        charged=rule.charged,
        job_state=to,
        failure_retries_used=failures,
        lost_retries_used=losses,
        backoff_s=backoff,
        message=message,
        ledger_class=rule.ledger_class,
        disruptions_used=disruptions,
        holds_slot=rule.holds_slot,
    )


def lease_expiry_cause(
    lease_expires_at: datetime, lease_s: float, probe_ok_at: datetime | None, overdue_s: float
) -> EndCause:
    """Why an attempt's lease ran out, from the machine's other liveness channel.

    The worker renews the lease (``lease_expires_at`` is its last renewal plus
    ``lease_s``); the reaper's probe reaches the agent (``probe_ok_at``). When the agent
    answered a probe ``overdue_s`` or more after the last renewal, the machine was up well
    after its worker went quiet: the worker died or our path to it broke — the platform's
    parts, out of the slot user's reach — so it is ``WORKER_LOST``, a disruption. Otherwise
    the machine went dark with the job on it, which the job might have caused:
    ``LEASE_EXPIRED``, on the patient budget."""
    renewed_at = lease_expires_at - timedelta(seconds=lease_s)
    if probe_ok_at is not None and probe_ok_at >= renewed_at + timedelta(seconds=overdue_s):
        return C.WORKER_LOST
    return C.LEASE_EXPIRED


def cause_of_report(
    outcome: AttemptState, *, slot_not_closed: bool = False, disrupted: bool = False
) -> EndCause:
    """The cause of an end the worker reports (its runner's outcome and the facts it adds
    to an INFRA_ERROR: the walls were never built, or the platform stopped a job running
    well)."""
    infra = C.SLOT_NOT_CLOSED if slot_not_closed else C.DISRUPTED if disrupted else C.INFRA_ERROR
    return {
        AS.SUCCEEDED: C.SUCCEEDED,
        AS.FAILED: C.JOB_FAILED,
        AS.TIMED_OUT: C.RUNNER_TIMED_OUT,
        AS.CANCELLED: C.RUNNER_CANCELLED,
        AS.INFRA_ERROR: infra,
    }[outcome]


def table_rows() -> Iterable[tuple[str, str, str, str, str, str]]:
    """The cause table as text, for the design doc and its test: (cause, attempt, charged,
    job, by, slot)."""
    for cause, rule in END_RULES.items():
        yield (
            cause.value,
            rule.attempt_state.value,
            "charged" if rule.charged else "not charged",
            rule.job.value,
            ", ".join(sorted(m.value for m in rule.by)),
            "held until gone" if rule.holds_slot else "freed",
        )
