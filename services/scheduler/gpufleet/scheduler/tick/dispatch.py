"""The assign step's writes and the agent dispatch that follows them.

One tick's assignments are committed in one transaction, fenced by the epoch once: the
attempts inserted in ``STARTING``, the jobs moved to ``DISPATCHING`` with their events,
the machines' idle timers cleared — a fixed number of statements whatever the number of
assignments (each checked against the rows read in the same transaction: the job still
queued, the machine still ready, its slots still free); the machines whose timers were set
are counted ``cleared`` once the commit is done (:mod:`~gpufleet.scheduler.tick.idle_timers`).
The agent StartJob calls then run in a :class:`~gpufleet.common.calls.CallPool` of their
own — never the pool of the provider calls, so any number of slow or hung cloud creates
leaves dispatch unaffected — each on the machine's reused channel; the tick does not wait
for them. The attempt's job tokens are minted in the same commit (their hashes inserted
beside the attempts), so a dispatch is one agent call and nothing else.

An attempt whose StartJob was sent and not answered within ``dispatch_deadline_s`` is
taken back: it ends ``INFRA_ERROR``, uncharged, the job is requeued and the agent is told to
cancel it. A machine backs off (doubling) only when its agent answered badly or did not
answer; a StartJob still waiting in this process's own pool is not its agent's fault
(:mod:`~gpufleet.scheduler.tick.dispatch_failure`).
"""

from __future__ import annotations

import functools
import json
import logging
import secrets
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast
from uuid import UUID

from sqlalchemy import Table, Text, or_, select, update
from sqlalchemy import cast as cast_
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool, Outcomes
from gpufleet.common.clients.agent import AgentClients
from gpufleet.common.clock import Clock
from gpufleet.common.convert import dur
from gpufleet.common.db import models
from gpufleet.common.db.bulk import among, insert_rows
from gpufleet.common.db.enums import LIVE_ATTEMPT_STATES, AttemptState, JobState, MachineState
from gpufleet.common.errors import Fenced, GpufleetError
from gpufleet.common.job_lifecycle import EndCause, Mover, check_job_move
from gpufleet.common.job_outcomes import OutcomeTally
from gpufleet.common.job_writer import attempts_running, end_attempt, move_jobs
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.scheduler.checkpoints import latest_checkpoints
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.dispatch_failure import (
    BACKS_OFF,
    DISPATCH_TOOK,
    DispatchFailure,
    backed_off,
    classify_agent_error,
    overdue,
)
from gpufleet.scheduler.tick.earmarks import clear_for_started_films
from gpufleet.scheduler.tick.idle_timers import clear_for_work
from gpufleet.scheduler.tick.metrics import Assigned, TickMetrics
from gpufleet.scheduler.tick.model import Assignment, PendingChange
from gpufleet.scheduler.tick.pending_writes import Written, write_pending
from gpufleet.scheduler.token_service import JOB_TOKENS, TokenMinter
from gpufleet.scheduler.watchdogs.common import queued_since
from gpufleet.v1 import agent_service_pb2

log = logging.getLogger(__name__)

_LIVE = [s.value for s in LIVE_ATTEMPT_STATES]
# Core tables for the executemany statements (no ORM object per row on this path).
_ATTEMPTS = cast(Table, models.Attempt.__table__)
_JOBS = cast(Table, models.Job.__table__)
_EVENTS = cast(Table, models.JobEvent.__table__)
_MACHINES = cast(Table, models.Machine.__table__)
# Rows per IN (...) list: well under every driver's parameter limit.
CHUNK = 2000
# Attempts in one StartJobs call (the agent takes up to 64).
PER_CALL = 32
# Assignments written in one transaction (a fixed number of statements each).
COMMIT_CHUNK = 1000


def chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


def _count(written: Written, report: TickReport) -> None:
    for what, n in (
        ("pending_reason_set", written.set),
        ("pending_reason_cleared", written.cleared),
        ("pending_reason_events", written.events),
    ):
        if n:
            report.actions[what] += n


@dataclass(frozen=True)
class Dispatch:
    attempt_id: str
    machine_id: str
    address: str
    request: agent_service_pb2.AgentServiceStartJobRequest
    # What its start's metrics need (its wait, its dispatch), carried from the commit.
    assigned: Assigned


def start_request(
    attempt_id: str,
    job: Any,
    kind: Any,
    slot: int,
    slots: int,
    checkpoint: Any = None,
    tokens: dict[str, str] | None = None,
) -> agent_service_pb2.AgentServiceStartJobRequest:
    """The StartJob an attempt sends, from its job's and kind's rows (and the checkpoint
    it starts from, for a kind that resumes from one), with the attempt's tokens."""
    return agent_service_pb2.AgentServiceStartJobRequest(
        request_id=attempt_id,
        attempt_id=attempt_id,
        job_id=job.id,
        slot=slot,
        kind=job.kind_id,
        pipeline_version=job.pipeline_version,
        tenant_values=job.tenant_values or {},
        time_limit=dur(kind.time_limit_s),
        workspace=job.workspace_id,
        slots=slots,
        # A kind that runs a writer's code gets no network but its tunnels.
        outbound_network=not kind.runs_writer_code,
        memory_limit_bytes=kind.memory_limit_mb << 20,
        pids_limit=kind.pids_limit,
        keeps_checkpoint=kind.resumes_from_checkpoint,
        checkpoint_id=checkpoint.id if checkpoint is not None else "",
        checkpoint_sha256=checkpoint.sha256 if checkpoint is not None else "",
        checkpoint_size_bytes=checkpoint.size_bytes if checkpoint is not None else 0,
        tokens=tokens or {},
    )


_JOB_COLUMNS = (
    models.Job.id,
    models.Job.state,
    models.Job.kind_id,
    models.Job.workspace_id,
    models.Job.pipeline_version,
    models.Job.tenant_values,
    models.Job.attempt_count,
)
# The assign step's read of its jobs: the tenant values as JSON text, parsed by json.loads
# (the driver's own JSON loader cost 30 us a row, a fifth of a burst's commit); and when
# each began its wait, for the queue-wait metric (the request watchdogs' own rule).
_ASSIGN_JOB_COLUMNS = (
    *_JOB_COLUMNS[:5],
    cast_(models.Job.tenant_values, Text).label("tenant_values_json"),
    models.Job.attempt_count,
    queued_since().label("queued_since"),
)


class DispatchController:
    """Commits the assign step in one transaction and dispatches it outside the tick."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        lease: LeaderLease,
        settings: Settings,
        calls: CallPool,
        agents: AgentClients,
        outcomes: Outcomes,
        metrics: TickMetrics,
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self.lease = lease
        self.settings = settings
        self.retry_policy = settings.retry_policy()
        self.calls = calls
        self.agents = agents
        self.outcomes = outcomes
        self.metrics = metrics
        self.minter = TokenMinter(
            sessions, clock, settings.token_spend_cap_micros, settings.token_expiry_margin_s
        )
        self._started_lock = threading.Lock()
        self._started: list[Dispatch] = []
        self._flushing = False
        # Attempts being dispatched from here -> when their StartJob was sent (None while it
        # still waits in the pool); an entry lives until the call's outcome is recorded.
        self._sent_lock = threading.Lock()
        self._sent: dict[str, datetime | None] = {}

    # -- the commit (in the tick) ---------------------------------------------------------
    def commit(
        self,
        assignments: list[Assignment],
        now: datetime,
        report: TickReport,
        tiers: Mapping[str, int] | None = None,
        pending: Sequence[PendingChange] = (),
    ) -> list[str]:
        """Commit the assignments ``COMMIT_CHUNK`` at a time, each part fenced and handed to
        the dispatch pool as soon as it is committed: the first StartJob calls go out while
        the rest of a burst is still being written. Returns the machine of each assignment
        committed (for the assignments counted by pool). ``tiers``: each job's plan tier
        (from the snapshot), for its queue wait's label. ``pending``: the waiting jobs'
        reasons that changed, written in the first part's transaction (one statement; a
        fenced transaction of their own on a tick that assigns nothing)."""
        committed: list[str] = []
        if pending and not assignments:
            with self.sessions() as session, session.begin():
                self.lease.fence(session)
                written = write_pending(session.connection(), pending, now)
            _count(written, report)
        for i in range(0, len(assignments), COMMIT_CHUNK):
            part = assignments[i : i + COMMIT_CHUNK]
            written = Written()
            with self.sessions() as session, session.begin():
                self.lease.fence(session)
                if i == 0:
                    written = write_pending(session.connection(), pending, now)
                dispatches, timers_cleared = self._write(session, part, now, tiers or {})
            _count(written, report)
            self.metrics.idle_timers.committed(timers_cleared)
            report.actions["assign"] += len(dispatches)
            if len(dispatches) < len(part):
                report.refusals["assignment_stale"] += len(part) - len(dispatches)
            committed += [d.machine_id for d in dispatches]
            self._submit_all(dispatches)
        return committed

    def _write(
        self, session: Session, assignments: list[Assignment], now: datetime, tiers: Mapping[str, int]
    ) -> tuple[list[Dispatch], int]:
        """The assignments still valid, written; and how many of their machines had idle
        timers set (cleared here)."""
        dialect = session.get_bind().dialect.name
        job_ids = [a.job_id for a in assignments]
        machine_ids = sorted({a.machine_id for a in assignments})
        jobs: dict[str, Any] = {}
        waiting_since: dict[str, datetime] = {}
        for part in chunks(job_ids):
            query = select(*_ASSIGN_JOB_COLUMNS).where(among(models.Job.id, part, dialect)).with_for_update()
            for job_row in session.execute(query):
                jobs[job_row.id] = _AssignedJob.of(job_row)
                waiting_since[job_row.id] = job_row.queued_since
        machines: dict[str, Any] = {}
        busy: dict[str, set[int]] = {}
        for part in chunks(machine_ids):
            for row in session.execute(
                select(
                    models.Machine.id,
                    models.Machine.state,
                    models.Machine.agent_address,
                    models.Machine.earmarked_for,
                ).where(among(models.Machine.id, part, dialect))
            ):
                machines[row.id] = row
            for mid, slot, n in session.execute(
                select(models.Attempt.machine_id, models.Attempt.slot, models.Attempt.slots).where(
                    among(models.Attempt.machine_id, part, dialect),
                    or_(models.Attempt.state.in_(_LIVE), models.Attempt.holds_slot.is_(True)),
                )
            ):
                busy.setdefault(mid, set()).update(range(slot, slot + n))
        kinds = {k.id: k for k in session.execute(select(models.JobKind)).scalars()}
        resuming = [
            a.job_id for a in assignments if (j := jobs.get(a.job_id)) is not None and _resumes(kinds, j)
        ]
        checkpoints = latest_checkpoints(session, resuming)

        attempts: list[dict[str, Any]] = []
        job_updates: list[str] = []
        events: list[dict[str, Any]] = []
        token_rows: list[dict[str, Any]] = []
        dispatches: list[Dispatch] = []
        films: list[tuple[str, str]] = []
        lease_until = now + timedelta(seconds=self.settings.attempt_lease_s)
        epoch = self.lease.epoch or 0
        # Randomness for every attempt's id and tokens, drawn at once (one system call each
        # rather than three per attempt: each also waited to take the interpreter back from
        # the threads already dispatching).
        drawn = self.minter.draw(len(assignments))
        ids = secrets.token_bytes(16 * len(assignments))
        for n, a in enumerate(assignments):
            job, machine = jobs.get(a.job_id), machines.get(a.machine_id)
            if job is None or machine is None or job.state != JobState.QUEUED.value:
                continue
            # A machine held for a film takes only that film, once ready or drained.
            if machine.earmarked_for not in (None, job.id):
                continue
            if machine.state != MachineState.READY.value and not (
                machine.state == MachineState.DRAINING.value and machine.earmarked_for == job.id
            ):
                continue
            taken = busy.setdefault(a.machine_id, set())
            if taken & set(a.slots):
                continue
            taken.update(a.slots)
            jobs[a.job_id] = None  # a job is assigned once per tick
            if kinds[job.kind_id].slots == 0:
                films.append((job.id, a.machine_id))
            attempt_id = str(UUID(bytes=ids[16 * n : 16 * n + 16], version=4))
            count = job.attempt_count + 1
            checkpoint = checkpoints.get(job.id)
            message = f"attempt {count} on machine {a.machine_id} slot {a.slots[0]}" + (
                f", from checkpoint {checkpoint.sequence}" if checkpoint is not None else ""
            )
            attempts.append(
                {
                    "id": attempt_id,
                    "job_id": job.id,
                    "machine_id": a.machine_id,
                    "slot": a.slots[0],
                    "slots": len(a.slots),
                    "state": AttemptState.STARTING.value,
                    "started_at": now,
                    "lease_expires_at": lease_until,
                    "slot_seconds": 0.0,
                    "charged": False,
                    "charge_micros": 0,
                    "status_message": "",
                    "epoch": epoch,
                    "checkpoint_id": checkpoint.id if checkpoint is not None else None,
                }
            )
            job_updates.append(job.id)
            events.append(
                {"job_id": job.id, "state": JobState.DISPATCHING.value, "at": now, "message": message}
            )
            kind = kinds[job.kind_id]
            # The attempt's tokens: their hashes go in with the attempt, the tokens themselves
            # travel once, in its StartJob.
            minted = self.minter.rows(
                workspace=job.workspace_id,
                job_id=job.id,
                attempt_id=attempt_id,
                time_limit=timedelta(seconds=kind.time_limit_s),
                now=now,
                minted=drawn[n],
            )
            token_rows.extend(minted.rows)
            tier = tiers.get(job.id)
            dispatches.append(
                Dispatch(
                    attempt_id,
                    a.machine_id,
                    machine.agent_address or "",
                    start_request(attempt_id, job, kind, a.slots[0], len(a.slots), checkpoint, minted.tokens),
                    Assigned(
                        job.kind_id,
                        now,
                        plan_tier=str(tier) if tier is not None else None,
                        queued_since=waiting_since.get(job.id),
                    ),
                )
            )
        if not dispatches:
            return [], 0
        conn = session.connection()
        insert_rows(conn, _ATTEMPTS, attempts)
        # Every assigned job moves alike (its attempt's machine and slot are in its event):
        # the lifecycle's move, written here in one statement with the attempt's count.
        check_job_move(JobState.QUEUED, JobState.DISPATCHING, Mover.DISPATCH)
        for part in chunks(job_updates):
            conn.execute(
                update(_JOBS)
                .where(among(_JOBS.c.id, part, dialect), _JOBS.c.state == JobState.QUEUED.value)
                .values(
                    state=JobState.DISPATCHING.value,
                    attempt_count=_JOBS.c.attempt_count + 1,
                    status_message="dispatching to its machine",
                    updated_at=now,
                    # It waits no more: its reason goes with its wait.
                    pending_reason=None,
                    pending_message=None,
                    pending_ready_at=None,
                )
            )
        insert_rows(conn, _EVENTS, events)
        insert_rows(conn, JOB_TOKENS, token_rows)
        clear_for_started_films(session, films, now)
        # The scheduler never races the money chain: work assigned clears both timers.
        timers_cleared = clear_for_work(conn, [d.machine_id for d in dispatches])
        return dispatches, timers_cleared

    # -- the dispatch (in the pool) -------------------------------------------------------
    def _submit_all(self, dispatches: list[Dispatch]) -> int:
        """Hand dispatches to the pool, one call per machine (StartJobs, at most
        ``PER_CALL`` attempts each); returns how many were submitted (an attempt already
        being dispatched here is not submitted again)."""
        groups: dict[tuple[str, str], list[Dispatch]] = {}
        with self._sent_lock:
            for d in dispatches:
                if d.attempt_id in self._sent:
                    continue
                self._sent[d.attempt_id] = None
                groups.setdefault((d.machine_id, d.address), []).append(d)
        submitted = 0
        for group in groups.values():
            for i in range(0, len(group), PER_CALL):
                part = group[i : i + PER_CALL]
                if self.calls.submit(
                    f"dispatch:{part[0].attempt_id}", functools.partial(self._dispatch, part)
                ):
                    submitted += len(part)
                else:
                    for d in part:
                        self._done(d.attempt_id)
        return submitted

    def _dispatching_now(self) -> set[str]:
        with self._sent_lock:
            return set(self._sent)

    def _done(self, attempt_id: str) -> None:
        with self._sent_lock:
            self._sent.pop(attempt_id, None)

    def _dispatch(self, group: list[Dispatch]) -> None:
        """One StartJobs call for a machine's attempts; each answered on its own."""
        machine_id, address = group[0].machine_id, group[0].address
        sent = self.clock.now()
        with self._sent_lock:
            for d in group:
                self._sent[d.attempt_id] = sent
        try:
            results = self.agents.get(machine_id, address).start_jobs([d.request for d in group])
        except GpufleetError as exc:
            cause = classify_agent_error(getattr(exc, "grpc_code", None))
            self._failed(group, f"agent did not start the job ({cause.value}): {exc}", cause)
            return
        except Exception as exc:  # a fault of ours, not the agent's: taken back, no back-off
            log.exception("dispatch to machine %s failed before an answer", machine_id)
            self._failed(group, f"dispatch failed here: {exc}", DispatchFailure.NOT_DISPATCHED)
            return
        answered = {r.attempt_id: r for r in results}
        started: list[Dispatch] = []
        for d in group:
            result = answered.get(d.attempt_id)
            if result is not None and result.code == 0:
                started.append(d)
                continue
            why = result.message if result is not None else "the agent did not answer for it"
            self._failed([d], f"agent refused the job: {why}", DispatchFailure.AGENT_REFUSED)
        if started:
            self._started_batch(started)

    def _started_batch(self, started: list[Dispatch]) -> None:
        # Record the starts in batches: the worker whose call finished first writes every
        # start that finished meanwhile, in one transaction, while the others go back to
        # calling agents. One transaction per start would cap dispatch at a few hundred a
        # second. (Should a write fail, the attempts stay STARTING and the worker's next
        # heartbeat, which reports them running, moves them.)
        with self._started_lock:
            self._started.extend(started)
            if self._flushing:
                return
            self._flushing = True
        while True:
            with self._started_lock:
                batch, self._started = self._started, []
                if not batch:
                    self._flushing = False  # under the lock: a start added now flushes itself
                    return
            try:
                self._record_started(batch)
            except Exception:
                with self._started_lock:
                    self._flushing = False
                for left in batch:
                    self._done(left.attempt_id)
                raise

    def _record_started(self, batch: list[Dispatch]) -> None:
        """STARTING -> RUNNING for each dispatched attempt, its job DISPATCHING -> RUNNING,
        its machine's dispatch back-off cleared; an attempt taken back meanwhile (dispatch
        deadline, lost lease, cancel) is stopped on its agent instead."""
        now = self.clock.now()
        by_id = {d.attempt_id: d for d in batch}
        starting: list[Any] = []
        gone: list[str] = []
        with self.sessions() as session, session.begin():
            dialect = session.get_bind().dialect.name
            for part in chunks(list(by_id)):
                rows = session.execute(
                    select(models.Attempt.id, models.Attempt.state, models.Attempt.job_id)
                    .where(among(models.Attempt.id, part, dialect))
                    .with_for_update()
                ).all()
                starting += [r for r in rows if r.state == AttemptState.STARTING.value]
                gone += [r.id for r in rows if r.state not in _LIVE]
            for part in chunks([r.id for r in starting]):
                attempts_running(session, list(part), by=Mover.DISPATCH)
            for part in chunks([r.job_id for r in starting]):
                move_jobs(
                    session,
                    list(part),
                    JobState.DISPATCHING,
                    JobState.RUNNING,
                    now,
                    by=Mover.DISPATCH,
                    message="running",
                )
            for part in chunks(sorted({d.machine_id for d in batch})):
                session.execute(
                    update(_MACHINES)
                    .where(among(_MACHINES.c.id, part, dialect), _MACHINES.c.dispatch_failures != 0)
                    .values(**DISPATCH_TOOK.values())
                )
        for d in batch:
            self._done(d.attempt_id)
        for attempt_id in gone:
            self.outcomes.add("dispatch_after_take_back")
            gone_d = by_id[attempt_id]
            self.cancel(gone_d.machine_id, gone_d.address, attempt_id, "attempt taken back before it started")
        self.outcomes.add("dispatched", len(starting))
        self.metrics.started((by_id[r.id].assigned for r in starting), now)

    def _failed(self, group: list[Dispatch], why: str, cause: DispatchFailure) -> None:
        """Take the attempts back in one transaction — fenced: a deposed leader's view of a
        dispatch it started is not acted on (the new leader re-dispatched it and owns its
        deadline). The machine backs off once for the call, and only for its agent's fault."""
        now = self.clock.now()
        taken = 0
        tally = OutcomeTally()
        try:
            with self.sessions() as session, session.begin():
                epoch = self.lease.fence(session)
                for d in group:
                    taken += self._take_back(
                        session, d.attempt_id, now, why, "fleet_tick.dispatch", epoch, tally
                    )
                if taken and BACKS_OFF[cause]:
                    self._back_off(session, group[0].machine_id, now)
        except Fenced as exc:
            for d in group:
                log.warning(
                    "attempt %s: the agent's refusal is not recorded by a deposed leader (%s)",
                    d.attempt_id,
                    exc,
                )
            self.outcomes.add("dispatch_outcome_fenced", len(group))
            return
        finally:
            for d in group:
                self._done(d.attempt_id)
        self.outcomes.add("start_job_failed", taken)
        self.outcomes.add(f"start_job_failed_{cause.value}", taken)
        self.metrics.dispatch_failed(cause, taken)
        self.metrics.jobs.committed(tally)

    def _take_back(
        self,
        session: Session,
        attempt_id: str,
        now: datetime,
        why: str,
        detector: str,
        epoch: int,
        tally: OutcomeTally,
    ) -> bool:
        """End a live attempt INFRA_ERROR, uncharged, and requeue its job (our failure)."""
        attempt = session.get(models.Attempt, attempt_id, with_for_update=True)
        if attempt is None or attempt.state not in _LIVE:
            return False
        ended = end_attempt(
            session,
            attempt,
            EndCause.TAKEN_BACK,
            now,
            by=Mover.DISPATCH,
            policy=self.retry_policy,
            message=why,
            tally=tally,
        )
        record_failure(
            session,
            now,
            FailureClass.JOB_INFRA_ERROR,
            detector,
            machine_id=attempt.machine_id,
            job_id=ended.job.id,
            attempt_id=attempt.id,
            details=f"{why} (leader epoch {epoch})",
        )
        return True

    def _back_off(self, session: Session, machine_id: str, now: datetime) -> None:
        """Keep jobs away from a machine whose agent answered badly or did not answer
        (:data:`BACKS_OFF`): doubling per failure in a row, capped."""
        machine = session.get_one(models.Machine, machine_id, with_for_update=True)
        settings = self.settings
        after = backed_off(
            machine.dispatch_failures, now, settings.dispatch_backoff_s, settings.dispatch_backoff_max_s
        )
        for column, value in after.values().items():
            setattr(machine, column, value)

    # -- follow-ups (in the tick: database only) ------------------------------------------
    def take_back_overdue(self, now: datetime, report: TickReport) -> None:
        """Attempts still STARTING past the dispatch deadline, taken back when
        :func:`~gpufleet.scheduler.tick.dispatch_failure.overdue` says so (the agent told);
        one still waiting in this process's own pool is left to its call."""
        limit = timedelta(seconds=self.settings.dispatch_deadline_s)
        with self.sessions() as session:
            rows = session.execute(
                select(models.Attempt.id, models.Machine.id, models.Machine.agent_address)
                .join(models.Machine, models.Machine.id == models.Attempt.machine_id)
                .where(
                    models.Attempt.state == AttemptState.STARTING.value,
                    models.Attempt.started_at < now - limit,
                )
            ).all()
        for attempt_id, machine_id, address in rows:
            with self._sent_lock:
                in_flight = attempt_id in self._sent
                sent_at = self._sent.get(attempt_id)
            cause = overdue(now, deadline=limit, in_flight=in_flight, sent_at=sent_at)
            if cause is None:
                report.refusals["dispatch_queued_here"] += 1
                continue
            why = (
                f"not started within the dispatch deadline ({self.settings.dispatch_deadline_s:g} s; "
                f"{cause.value})"
            )
            tally = OutcomeTally()
            with self.sessions() as session, session.begin():
                epoch = self.lease.fence(session)
                taken = self._take_back(
                    session, attempt_id, now, why, "fleet_tick.dispatch_deadline", epoch, tally
                )
                if taken and BACKS_OFF[cause]:
                    self._back_off(session, machine_id, now)
            self.metrics.jobs.committed(tally)
            if taken:
                report.actions["dispatch_taken_back"] += 1
                report.actions[f"dispatch_taken_back_{cause.value}"] += 1
                self.metrics.dispatch_failed(cause, 1)
                log.warning("attempt %s taken back: %s", attempt_id, why)
                if address:
                    self.cancel(machine_id, address, attempt_id, why)

    def adopt(self, now: datetime, report: TickReport) -> None:
        """Re-dispatch attempts committed STARTING that no worker here is dispatching (a
        leader change, a restart): StartJob is idempotent by attempt id on the agent. Each
        re-dispatch carries tokens of its own (the first ones stay valid: the agent may
        already run the job with them), minted for the whole batch in one transaction."""
        deadline = now - timedelta(seconds=self.settings.dispatch_deadline_s)
        # Read before the store: an attempt dispatched here whose start is recorded between
        # the query and the check must not look abandoned.
        here = self._dispatching_now()
        with self.sessions() as session:
            starting = session.execute(
                select(models.Attempt.id).where(
                    models.Attempt.state == AttemptState.STARTING.value, models.Attempt.started_at >= deadline
                )
            ).scalars()
            orphans = [a for a in starting if a not in here]
            if not orphans:
                return
            rows = session.execute(
                select(
                    models.Attempt.id,
                    models.Attempt.machine_id,
                    models.Attempt.slot,
                    models.Attempt.slots,
                    models.Attempt.checkpoint_id,
                    models.Attempt.started_at,
                    models.Machine.agent_address,
                    *_JOB_COLUMNS[1:],
                    models.Job.id.label("job_id"),
                )
                .join(models.Machine, models.Machine.id == models.Attempt.machine_id)
                .join(models.Job, models.Job.id == models.Attempt.job_id)
                .where(
                    models.Attempt.id.in_(orphans[:CHUNK]),
                    models.Attempt.state == AttemptState.STARTING.value,
                )
            ).all()
            if not rows:
                return
            kinds = {k.id: k for k in session.execute(select(models.JobKind)).scalars()}
            wanted = [r.checkpoint_id for r in rows if r.checkpoint_id]
            started_from = {
                c.id: c
                for c in session.execute(
                    select(models.Checkpoint).where(models.Checkpoint.id.in_(wanted or [""]))
                ).scalars()
            }
        dispatches = [
            Dispatch(
                row.id,
                row.machine_id,
                row.agent_address or "",
                start_request(
                    row.id,
                    _AssignedJob(
                        row.job_id,
                        row.state,
                        row.kind_id,
                        row.workspace_id,
                        row.pipeline_version,
                        row.tenant_values,
                        row.attempt_count,
                    ),
                    kinds[row.kind_id],
                    row.slot,
                    row.slots,
                    started_from.get(row.checkpoint_id or ""),
                ),
                # Its commit's reading of the job's wait is gone with that leader.
                Assigned(row.kind_id, row.started_at),
            )
            for row in rows
        ]
        try:
            minted = self.minter.mint_many([d.request for d in dispatches])
        except Exception as exc:  # the database: taken back, the machine not blamed
            log.warning("re-dispatch of %d attempt(s): tokens not minted: %s", len(dispatches), exc)
            self._failed(dispatches, f"tokens not minted: {exc}", DispatchFailure.TOKENS_NOT_MINTED)
            return
        for d in dispatches:
            d.request.tokens.update(minted[d.attempt_id])
        report.actions["dispatch_adopted"] += self._submit_all(dispatches)

    def cancel(self, machine_id: str, address: str, attempt_id: str, reason: str) -> None:
        """Tell the agent to stop an attempt, from the pool: a frozen agent costs only its
        own call. Not delivered: the worker's next heartbeat repeats it."""

        def call() -> None:
            try:
                self.agents.get(machine_id, address).cancel_job(attempt_id, reason)
            except GpufleetError as exc:
                log.warning(
                    "cancel of %s on %s not delivered (%s); the next heartbeat repeats it",
                    attempt_id,
                    address,
                    exc,
                )

        self.calls.submit(f"cancel:{attempt_id}", call)


def _resumes(kinds: dict[str, Any], job: Any) -> bool:
    kind = kinds.get(job.kind_id)
    return bool(kind is not None and kind.resumes_from_checkpoint)


@dataclass(frozen=True)
class _AssignedJob:
    id: str
    state: str
    kind_id: str
    workspace_id: str
    pipeline_version: str
    tenant_values: dict[str, str] | None
    attempt_count: int

    @classmethod
    def of(cls, row: Any) -> _AssignedJob:
        text = row.tenant_values_json
        return cls(
            row.id,
            row.state,
            row.kind_id,
            row.workspace_id,
            row.pipeline_version,
            json.loads(text) if text else None,
            row.attempt_count,
        )
