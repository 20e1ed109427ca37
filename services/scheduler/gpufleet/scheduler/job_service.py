"""JobService: the product backend's API (submit, get, list, cancel, watch)."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, cast

import grpc
from sqlalchemy import Connection, Engine, Table, bindparam, select, text
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import paging
from gpufleet.common.clients.agent import AgentClient, AgentClients
from gpufleet.common.clock import Clock
from gpufleet.common.convert import enum_name, enum_value, ts
from gpufleet.common.db import models
from gpufleet.common.db.enums import LIVE_ATTEMPT_STATES, TERMINAL_JOB_STATES, JobState
from gpufleet.common.db.statements import SqliteWriter, StatementPool
from gpufleet.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    GpufleetError,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
)
from gpufleet.common.job_lifecycle import EndCause, Mover, RetryPolicy
from gpufleet.common.job_outcomes import JobOutcomes, OutcomeTally
from gpufleet.common.job_writer import end_attempt, move_job
from gpufleet.common.metrics.catalog import JOBS_SUBMITTED
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.trust.transport import Transport
from gpufleet.common.violations import Violations
from gpufleet.scheduler import validation
from gpufleet.scheduler.events import EventHub
from gpufleet.scheduler.render import job_from_row, job_to_proto
from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc

log = logging.getLogger(__name__)
# The most of a job's log one GetJobLog answers with.
MAX_LOG_PAGE = 1 << 20
# The most characters of a CancelJob's reason kept in the job's status message.
MAX_CANCEL_REASON = 1024

WATCH_POLL_S = 0.1
# WatchJob streams open at once, per client connection and in all (per caller identity
# once the trust issue's certificates name callers).
MAX_WATCH_STREAMS_PER_CONNECTION = 16
MAX_WATCH_STREAMS = 1024
_TERMINAL = frozenset(s.value for s in TERMINAL_JOB_STATES)
_JOBS = cast(Table, models.Job.__table__)
_EVENTS = cast(Table, models.JobEvent.__table__)


# SubmitJob's statements, built once: each call only binds its values (building them per
# call, with literal values, cost more than the database round trips).
_JOB_COLUMNS = (
    "id, request_id, request_hash, workspace_id, pool_id, kind_id, pipeline_version, tenant_values, "
    "state, created_at, updated_at, attempt_count, failure_retries_used, lost_retries_used, "
    "status_message, slot_seconds, charge_micros, cancel_requested, paid_wait_incident"
)
# On PostgreSQL the whole submission is one statement: the catalogue check, the insert
# idempotent by request_id, and the first event (a data-modifying CTE).
_SUBMIT_PG = text(
    "WITH ok AS ("
    " SELECT 1 FROM workspaces w, pools p, job_kinds k"
    " WHERE w.id = :workspace_id AND w.active AND p.id = :pool_id AND k.id = :kind_id"
    " AND k.slots <= p.slots_per_machine"
    "), j AS ("
    f" INSERT INTO jobs ({_JOB_COLUMNS})"
    " SELECT :id, :request_id, :request_hash, :workspace_id, :pool_id, :kind_id, :pipeline_version,"
    " CAST(:tenant_values AS JSON), :state, :created_at, :updated_at, :attempt_count,"
    " :failure_retries_used, :lost_retries_used, :status_message, :slot_seconds, :charge_micros,"
    " :cancel_requested, :paid_wait_incident FROM ok"
    " ON CONFLICT (request_id) DO NOTHING RETURNING id, created_at"
    ")"
    " INSERT INTO job_events (job_id, state, at, message)"
    " SELECT id, 'QUEUED', created_at, 'submitted' FROM j RETURNING job_id"
)
# On SQLite, three statements in one write transaction on the kept writer connection.
_CATALOGUE_OK_SQLITE = (
    "SELECT 1 FROM workspaces w, pools p, job_kinds k"
    " WHERE w.id = :workspace_id AND w.active AND p.id = :pool_id AND k.id = :kind_id"
    " AND k.slots <= p.slots_per_machine"
)
_INSERT_JOB_SQLITE = (
    f"INSERT INTO jobs ({_JOB_COLUMNS}) VALUES ("
    + ", ".join(f":{c.strip()}" for c in _JOB_COLUMNS.split(","))
    + ") ON CONFLICT (request_id) DO NOTHING RETURNING id"
)
_INSERT_EVENT_SQLITE = (
    "INSERT INTO job_events (job_id, state, at, message) VALUES (:job_id, :state, :at, :message)"
)
_W, _P, _K = models.Workspace, models.Pool, models.JobKind
_CATALOGUE = select(
    select(_W.active).where(_W.id == bindparam("w")).scalar_subquery(),
    select(_P.slots_per_machine).where(_P.id == bindparam("p")).scalar_subquery(),
    select(_K.slots).where(_K.id == bindparam("k")).scalar_subquery(),
)


def unknown_job(job_id: str) -> NotFound:
    return NotFound(f"no job {job_id!r}", field="job_id", reason="UNKNOWN_JOB")


def jobs_position(token: str, found: Violations) -> tuple[datetime, str] | None:
    """Where a ListJobs page token says the last page ended: the last job's creation time
    (with its zone) and id, or None for the first page (and for a bad token, reported)."""
    position = paging.decode("jobs", token, found)
    if position is None:
        return None
    try:
        if not isinstance(position, list) or len(position) != 2:
            raise TypeError(position)
        after_time = datetime.fromisoformat(position[0])
        if after_time.tzinfo is None:
            raise ValueError(position[0])
    except (TypeError, ValueError):
        paging.malformed(found)
        return None
    return after_time, str(position[1])


class JobService(job_service_pb2_grpc.JobServiceServicer):
    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        transport: Transport,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self._submitted = instruments.counter(JOBS_SUBMITTED)
        self._outcomes = JobOutcomes(instruments)
        self.engine: Engine = sessions.kw["bind"]
        self._postgres = self.engine.dialect.name == "postgresql"
        # SubmitJob's one statement, prepared on connections of its own (see StatementPool),
        # awaited on the server's loop.
        self._statements = StatementPool(self.engine, max_size=16) if self._postgres else None
        self._submit_sql = self._statements.compile(_SUBMIT_PG) if self._statements else ""
        self._sqlite = SqliteWriter(self.engine) if not self._postgres else None
        self._job_binds = self._sqlite.processors(_JOBS) if self._sqlite else {}
        self._event_binds = self._sqlite.processors(_EVENTS) if self._sqlite else {}
        self.hub = EventHub(sessions, WATCH_POLL_S)
        # CancelJob's word to the agents: reused channels, on threads of their own.
        self._agents = AgentClients(lambda machine_id, address: AgentClient(machine_id, address, transport))
        self._notify = ThreadPoolExecutor(4, thread_name_prefix="cancel-notify")
        # GetJobLog asks the machine's agent: on threads of its own, so a flood of log reads
        # (or a machine slow to answer) queues here and never holds an API thread.
        self._logs = ThreadPoolExecutor(4, thread_name_prefix="job-log")
        # SubmitJob's work that cannot be awaited: SQLite's writes (behind the process's
        # writer lock) and the rare read of a known request_id or a catalogue miss.
        self._store = ThreadPoolExecutor(4, thread_name_prefix="submit-store")
        # Open WatchJob streams; touched only on the server's event loop.
        self._streams: Counter[str] = Counter()
        self._streams_total = 0

    def close(self) -> None:
        self.hub.executor.shutdown(wait=False, cancel_futures=True)
        self._notify.shutdown(wait=False, cancel_futures=True)
        self._logs.shutdown(wait=False, cancel_futures=True)
        self._store.shutdown(wait=False, cancel_futures=True)
        self._agents.close()
        if self._statements is not None:
            self._statements.close()
        if self._sqlite is not None:
            self._sqlite.close()

    # -- SubmitJob -------------------------------------------------------------------
    async def SubmitJob(
        self, request: job_service_pb2.SubmitJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> job_pb2.Job:
        """Validation in Python, then one short transaction: the catalogue check
        (workspace, pool and kind in one query), the job's insert that is idempotent by
        ``request_id`` (``ON CONFLICT DO NOTHING``), and its first event — on PostgreSQL
        one prepared statement (a data-modifying CTE) in autocommit, awaited on the
        server's event loop (no thread hop: profiled, the hop to an API thread and back
        cost more CPU than the statement); on SQLite three statements in one write
        transaction, on a thread of its own (SQLite's writer lock must not hold the
        loop). No ORM object graph: profiled, the old path spent its milliseconds in six
        statements and the ORM's flush. A repeated ``request_id`` reads the stored job and
        answers as the first call did (or refuses other content).

        A job that leaves out its pool or pipeline version gets its kind's defaults from
        the catalogue (one more read, only then); every bad field is answered at once."""
        found = validation.submission(request.request_id, request.job, request.HasField("job"))
        spec = request.job
        loop = asyncio.get_running_loop()
        if (not spec.pool or not spec.pipeline_version) and validation.IDENT.match(spec.kind):
            defaults = await loop.run_in_executor(self._store, self._kind_defaults, spec.kind)
            if defaults is not None:  # an unknown kind: the catalogue check names it below
                spec = validation.with_defaults(spec, *defaults, found)
        found.raise_if_any()
        content_hash = validation.content_hash(request.job)
        now = self.clock.now()
        job_id = str(uuid.uuid4())
        row = {
            "id": job_id,
            "request_id": request.request_id,
            "request_hash": content_hash,
            "workspace_id": spec.workspace,
            "pool_id": spec.pool,
            "kind_id": spec.kind,
            "pipeline_version": spec.pipeline_version,
            "tenant_values": dict(spec.tenant_values),
            "state": JobState.QUEUED.value,
            "created_at": now,
            "updated_at": now,
            "attempt_count": 0,
            "failure_retries_used": 0,
            "lost_retries_used": 0,
            "status_message": "",
            "slot_seconds": 0.0,
            "charge_micros": 0,
            "cancel_requested": False,
            "paid_wait_incident": False,
        }
        if self._statements is not None:
            inserted = await self._submit_postgres(row)
        else:
            inserted = await loop.run_in_executor(self._store, self._submit_sqlite, row)
        if not inserted:
            # The catalogue refused it (say which part), or the request_id is known:
            # answer as the first call did. Rare, and read through the ORM on a thread.
            return await loop.run_in_executor(
                self._store, self._known_submission, spec, request.request_id, content_hash
            )
        # Counted, not logged at INFO: one line a job cost 8 % of a SubmitJob's CPU, half
        # of it waiting on the log handler's lock. By pool and kind, both checked against
        # the catalogue by now; never by workspace, whose number has no bound.
        self._submitted.add(1, {"pool": spec.pool, "kind": spec.kind})
        log.debug(
            "job %s submitted for %s",
            job_id,
            spec.workspace,
            extra={"fields": {"job_id": job_id, "workspace": spec.workspace}},
        )
        return job_from_row(row)

    async def _submit_postgres(self, row: dict[str, Any]) -> bool:
        """One prepared statement, in autocommit: one round trip. False when it inserted
        nothing — a catalogue miss or a known request_id, which the caller tells apart."""
        assert self._statements is not None
        params = dict(row, tenant_values=json.dumps(row["tenant_values"]))
        return await self._statements.fetch_one(self._submit_sql, params, operation="INSERT") is not None

    def _known_submission(self, spec: job_pb2.Job, request_id: str, content_hash: str) -> job_pb2.Job:
        """A submission that inserted nothing: a catalogue miss (say which part) or a
        known ``request_id`` (the stored job, or a refusal of other content)."""
        with self.sessions() as session:
            self._check_catalogue(session.connection(), spec)
            existing = self._by_request_id(session, request_id, content_hash)
        if existing is None:
            raise FailedPrecondition("request_id conflict; retry", field="request_id")
        return existing

    def _submit_sqlite(self, row: dict[str, Any]) -> bool:
        """Three statements in one short write transaction (SQLite is in-process: no
        round trips), on the kept writer connection. False as for PostgreSQL."""
        assert self._sqlite is not None
        job = {k: self._job_binds[k](v) if k in self._job_binds else v for k, v in row.items()}
        event = {"job_id": row["id"], "state": row["state"], "at": row["created_at"], "message": "submitted"}
        event = {k: self._event_binds[k](v) if k in self._event_binds else v for k, v in event.items()}
        with self._sqlite.transaction() as conn:
            if conn.execute(_CATALOGUE_OK_SQLITE, job, operation="SELECT").fetchone() is None:
                return False
            if conn.execute(_INSERT_JOB_SQLITE, job, operation="INSERT").fetchone() is None:
                return False
            conn.execute(_INSERT_EVENT_SQLITE, event, operation="INSERT")
            return True

    def _kind_defaults(self, kind_id: str) -> tuple[str | None, str | None] | None:
        """The kind's default pool and pipeline version, or None for an unknown kind."""
        with self.sessions() as session:
            row = session.execute(
                select(_K.default_pool, _K.default_pipeline_version).where(_K.id == kind_id)
            ).one_or_none()
        return None if row is None else (row.default_pool, row.default_pipeline_version)

    @staticmethod
    def _check_catalogue(conn: Connection, spec: job_pb2.Job) -> None:
        """Workspace, pool and kind in one query; on a miss, say which is wrong."""
        found = conn.execute(_CATALOGUE, {"w": spec.workspace, "p": spec.pool, "k": spec.kind}).one()
        active, slots_per_machine, kind_slots = found
        if active is None:
            raise NotFound(
                f"unknown workspace {spec.workspace!r}", field="job.workspace", reason="UNKNOWN_WORKSPACE"
            )
        if not active:
            raise FailedPrecondition(
                f"workspace {spec.workspace!r} is not active",
                field="job.workspace",
                reason="WORKSPACE_PAUSED",
            )
        # The kind before the pool: a job that left its pool out for an unknown kind's
        # default has no pool to name.
        if kind_slots is None:
            raise NotFound(f"unknown job kind {spec.kind!r}", field="job.kind", reason="UNKNOWN_KIND")
        if slots_per_machine is None:
            raise NotFound(f"unknown pool {spec.pool!r}", field="job.pool", reason="UNKNOWN_POOL")
        if kind_slots > slots_per_machine:
            raise InvalidArgument(
                f"kind {spec.kind!r} needs {kind_slots} slots; pool {spec.pool!r} machines have "
                f"{slots_per_machine}",
                field="job.kind",
                reason="KIND_DOES_NOT_FIT_POOL",
            )

    @staticmethod
    def _by_request_id(session: Session, request_id: str, content_hash: str) -> job_pb2.Job | None:
        job = session.execute(
            select(models.Job).where(models.Job.request_id == request_id)
        ).scalar_one_or_none()
        if job is None:
            return None
        if job.request_hash != content_hash:
            raise AlreadyExists(
                f"request_id {request_id!r} was used for a different job ({job.id})",
                field="request_id",
                reason="REQUEST_ID_REUSED",
            )
        return job_to_proto(job)

    # -- GetJob / ListJobs -----------------------------------------------------------
    def GetJob(self, request: job_service_pb2.GetJobRequest, context: grpc.ServicerContext) -> job_pb2.Job:
        job_id = validation.job_id(request.job_id)
        with self.sessions() as session:
            return self._render(session, job_id)

    @staticmethod
    def _render(session: Session, job_id: str) -> job_pb2.Job:
        job = session.get(models.Job, job_id)
        if job is None:
            raise unknown_job(job_id)
        attempts = list(
            session.execute(
                select(models.Attempt)
                .where(models.Attempt.job_id == job_id)
                .order_by(models.Attempt.started_at, models.Attempt.id)
            ).scalars()
        )
        checkpoints = {
            c.id: c
            for c in session.execute(
                select(models.Checkpoint).where(models.Checkpoint.job_id == job_id)
            ).scalars()
        }
        return job_to_proto(job, attempts, checkpoints)

    def ListJobs(
        self, request: job_service_pb2.ListJobsRequest, context: grpc.ServicerContext
    ) -> job_service_pb2.ListJobsResponse:
        found = Violations()
        size = paging.page_size(request.page_size, found)
        position = jobs_position(request.page_token, found)
        found.known(request.state, job_pb2.JobState.values(), "state", "job state")
        found.raise_if_any()
        query = select(models.Job)
        with self.sessions() as session:
            if request.workspace:
                if session.get(models.Workspace, request.workspace) is None:
                    raise NotFound(
                        f"unknown workspace {request.workspace[:64]!r}",
                        field="workspace",
                        reason="UNKNOWN_WORKSPACE",
                    )
                query = query.where(models.Job.workspace_id == request.workspace)
            if request.pool:
                if session.get(models.Pool, request.pool) is None:
                    raise NotFound(f"unknown pool {request.pool[:64]!r}", field="pool", reason="UNKNOWN_POOL")
                query = query.where(models.Job.pool_id == request.pool)
            if request.state:
                query = query.where(
                    models.Job.state == enum_name(job_pb2.JobState, "JOB_STATE_", request.state)
                )
            if position is not None:
                after_time, after_id = position
                query = query.where(
                    (models.Job.created_at > after_time)
                    | ((models.Job.created_at == after_time) & (models.Job.id > after_id))
                )
            rows = list(
                session.execute(
                    query.order_by(models.Job.created_at, models.Job.id).limit(size + 1)
                ).scalars()
            )
        more = len(rows) > size
        rows = rows[:size]
        token = paging.encode("jobs", [rows[-1].created_at.isoformat(), rows[-1].id]) if more else ""
        return job_service_pb2.ListJobsResponse(jobs=[job_to_proto(j) for j in rows], next_page_token=token)

    # -- CancelJob -------------------------------------------------------------------
    def CancelJob(
        self, request: job_service_pb2.CancelJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.Job:
        found = Violations()
        job_id = validation.job_id(request.job_id, found)
        validation.optional_request_id(request.request_id, found)
        found.at_most(request.reason, "reason", MAX_CANCEL_REASON)
        found.raise_if_any()
        to_cancel: list[tuple[str, str, str]] = []
        tally = OutcomeTally()
        with self.sessions() as session, session.begin():
            # Locked: two cancels of one job (a client retrying) end it once, and the second
            # answers as the first did.
            job = session.get(models.Job, job_id, with_for_update=True)
            if job is None:
                raise unknown_job(job_id)
            if job.state in TERMINAL_JOB_STATES:
                if job.state == JobState.CANCELLED.value:
                    return self._render(session, job_id)
                raise FailedPrecondition(
                    f"job already ended ({job.state})", field="job_id", reason="JOB_ALREADY_ENDED"
                )
            before = job.state
            now = self.clock.now()
            message = f"cancelled: {request.reason}" if request.reason else "cancelled"
            live = session.execute(
                select(models.Attempt, models.Machine)
                .join(models.Machine, models.Machine.id == models.Attempt.machine_id)
                .where(
                    models.Attempt.job_id == job_id,
                    models.Attempt.state.in_([s.value for s in LIVE_ATTEMPT_STATES]),
                )
            ).all()
            job.cancel_requested = True
            for attempt, machine in live:
                # A cancelled attempt is charged for the GPU time it held until now.
                end_attempt(
                    session,
                    attempt,
                    EndCause.CANCEL_REQUESTED,
                    now,
                    by=Mover.CANCEL,
                    policy=RetryPolicy(),
                    why=message,
                )
                if machine.agent_address:
                    to_cancel.append((machine.id, machine.agent_address, attempt.id))
            if job.state != JobState.CANCELLED.value:  # no live attempt ended it
                move_job(session, job, JobState.CANCELLED, now, by=Mover.CANCEL, message=message)
            tally.job_moved(job.kind_id, before, job.state)
        self._outcomes.committed(tally)
        # After commit: tell the machines, off the API's threads (best effort; the next
        # heartbeat repeats it), so a hung agent holds no API thread for its deadline.
        for machine_id, address, attempt_id in to_cancel:
            self._notify.submit(self._tell_agent, machine_id, address, attempt_id)
        with self.sessions() as session:
            return self._render(session, job_id)

    def _tell_agent(self, machine_id: str, address: str, attempt_id: str) -> None:
        try:
            self._agents.get(machine_id, address).cancel_job(attempt_id, "job cancelled")
        except GpufleetError as exc:
            log.warning(
                "cancel of attempt %s on %s not delivered (%s); the worker's next heartbeat will be told",
                attempt_id,
                address,
                exc,
            )

    # -- WatchJob --------------------------------------------------------------------
    async def GetJobLog(
        self, request: job_service_pb2.GetJobLogRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> job_service_pb2.GetJobLogResponse:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._logs, self._job_log, request)

    def _job_log(self, request: job_service_pb2.GetJobLogRequest) -> job_service_pb2.GetJobLogResponse:
        found = Violations()
        job_id = validation.job_id(request.job_id, found)
        found.check(request.attempt_id, "attempt_id", validation.JOB_ID, "attempt id", required=False)
        if request.offset < 0:
            found.add("offset", "must not be negative", "OUT_OF_RANGE")
        size = request.max_bytes or MAX_LOG_PAGE
        if not 0 < size <= MAX_LOG_PAGE:
            found.add("max_bytes", f"must be 1-{MAX_LOG_PAGE}", "OUT_OF_RANGE")
        found.raise_if_any()
        with self.sessions() as session:
            if session.get(models.Job, job_id) is None:
                raise unknown_job(job_id)
            query = select(models.Attempt).where(models.Attempt.job_id == job_id)
            if request.attempt_id:
                query = query.where(models.Attempt.id == request.attempt_id)
            attempt = session.execute(
                query.order_by(models.Attempt.started_at.desc(), models.Attempt.id.desc()).limit(1)
            ).scalar_one_or_none()
            if attempt is None:
                if request.attempt_id:
                    raise NotFound(
                        "no such attempt of this job", field="attempt_id", reason="UNKNOWN_ATTEMPT"
                    )
                raise NotFound("the job has not run yet", field="job_id", reason="JOB_NOT_STARTED")
            machine = session.get_one(models.Machine, attempt.machine_id)
            ended = attempt.state not in LIVE_ATTEMPT_STATES
            attempt_id, state, address = attempt.id, machine.state, machine.agent_address
            machine_id = machine.id
        if state == "DESTROYED":
            raise FailedPrecondition(
                "the machine that ran it is destroyed, and its log with it",
                field="attempt_id",
                reason="LOG_MACHINE_DESTROYED",
            )
        if state in ("STOPPED", "STOPPING") or not address:
            raise FailedPrecondition(
                f"its machine is {state.lower()}: the log is kept on its disk, readable while it runs",
                field="attempt_id",
                reason="LOG_MACHINE_NOT_RUNNING",
            )
        part = self._agents.get(machine_id, address).read_job_log(attempt_id, request.offset, size)
        return job_service_pb2.GetJobLogResponse(
            attempt_id=attempt_id,
            data=part.data,
            next_offset=request.offset + len(part.data),
            end_of_log=part.end_of_log,
            attempt_ended=ended,
        )

    async def WatchJob(
        self, request: job_service_pb2.WatchJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[job_pb2.JobEvent]:
        """A stream holds no thread: it waits on the event loop for the hub to hand it its
        job's events (one query a poll for every stream), and a client that stops reading
        only stops its own stream. Streams are capped per connection and in all.

        A queued job's reason for waiting changing (``Job.pending_reason``, decided by the
        fleet tick) is an event of its own: state QUEUED, message ``waiting: ...``, the job
        as it is then.

        Each event carries its ``sequence`` (the job_events row's id); ``after_sequence``
        starts the stream after that point. Per job, ids commit in increasing order (every
        writer of a job's events holds the job's row lock until it commits; see
        :mod:`gpufleet.scheduler.events`), so the past read below and the hub's live events
        together miss none, and ``seen`` drops the ones both bring."""
        found = Violations()
        job_id = validation.job_id(request.job_id, found)
        if request.after_sequence < 0:
            found.add(
                "after_sequence", "must not be negative (0 streams from the first event)", "OUT_OF_RANGE"
            )
        found.raise_if_any()
        peer = context.peer()
        if self._streams_total >= MAX_WATCH_STREAMS:
            raise ResourceExhausted(
                f"{MAX_WATCH_STREAMS} WatchJob streams are open; try again later", reason="TOO_MANY_WATCHES"
            )
        if self._streams[peer] >= MAX_WATCH_STREAMS_PER_CONNECTION:
            raise ResourceExhausted(
                f"this connection already has {MAX_WATCH_STREAMS_PER_CONNECTION} WatchJob streams open",
                reason="TOO_MANY_WATCHES",
            )
        self._streams[peer] += 1
        self._streams_total += 1
        queue = self.hub.watch(job_id)
        try:
            loop = asyncio.get_running_loop()
            past = await loop.run_in_executor(
                self.hub.executor, self._past_events, job_id, request.after_sequence
            )
            if past is None:
                raise unknown_job(job_id)
            batch, ended = past
            if ended and not batch:
                return  # resumed after its final event: nothing more will come
            seen = request.after_sequence
            while True:
                fresh = [e for e in batch if e[0] > seen]
                if fresh:
                    snapshot = await loop.run_in_executor(self.hub.executor, self._render_alone, job_id)
                    for event_id, state, at, message in fresh:
                        seen = event_id
                        yield job_pb2.JobEvent(
                            job=snapshot,
                            state=enum_value(job_pb2.JobState, "JOB_STATE_", state),
                            event_time=ts(at),
                            message=message,
                            sequence=event_id,
                        )
                        if state in _TERMINAL:
                            return
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
        finally:
            self.hub.unwatch(job_id, queue)
            self._streams[peer] -= 1
            if not self._streams[peer]:
                del self._streams[peer]
            self._streams_total -= 1

    def _past_events(
        self, job_id: str, after: int
    ) -> tuple[list[tuple[int, str, datetime, str]], bool] | None:
        """The job's events after ``after``, oldest first, and whether it has ended (read
        first: an ended job's final event is then among its events); None for an unknown job."""
        with self.sessions() as session:
            job = session.get(models.Job, job_id)
            if job is None:
                return None
            ended = job.state in _TERMINAL
            rows = session.execute(
                select(models.JobEvent.id, models.JobEvent.state, models.JobEvent.at, models.JobEvent.message)
                .where(models.JobEvent.job_id == job_id, models.JobEvent.id > after)
                .order_by(models.JobEvent.id)
            ).all()
        return [tuple(r) for r in rows], ended  # type: ignore[misc]

    def _render_alone(self, job_id: str) -> job_pb2.Job:
        with self.sessions() as session:
            return self._render(session, job_id)
