"""WorkerService: what the worker on each machine reports for itself.

A heartbeat writes the worker channel (``worker_report_at``) — the only channel the
went-silent net reads — moves a booting machine to READY, and renews the leases of the
attempts the worker says it runs. A completion ends an attempt with its slot-seconds and
its charge; it is idempotent by attempt id, and a completion for an attempt already ended
(lost, timed out, cancelled) changes nothing.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta

import grpc
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import Clock
from gpufleet.common.convert import enum_name, machine_to_proto
from gpufleet.common.db import models
from gpufleet.common.db.enums import (
    LIVE_ATTEMPT_STATES,
    AttemptState,
    JobState,
    MachineIntent,
    MachineOrigin,
    MachineState,
    WorkloadClass,
)
from gpufleet.common.errors import FailedPrecondition, NotFound
from gpufleet.common.job_lifecycle import Mover, cause_of_report
from gpufleet.common.job_outcomes import JobOutcomes, OutcomeTally
from gpufleet.common.job_writer import end_attempt, move_job, start_attempt_running
from gpufleet.common.ledger import record_failure
from gpufleet.common.lifecycle import Actor, transition
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.trust.authz import require_self
from gpufleet.common.trust.identity import Identity
from gpufleet.common.trust.peer import identity_of
from gpufleet.scheduler import gpu_faults, validation
from gpufleet.scheduler.checkpoint_store import open_checkpoint_store
from gpufleet.scheduler.checkpoints import CheckpointService
from gpufleet.scheduler.render import attempt_to_proto
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.validation import IDENT, JOB_ID, Violations, require
from gpufleet.v1 import job_pb2, machine_pb2, worker_service_pb2, worker_service_pb2_grpc

log = logging.getLogger(__name__)

_REPORTABLE = {
    job_pb2.ATTEMPT_STATE_SUCCEEDED,
    job_pb2.ATTEMPT_STATE_FAILED,
    job_pb2.ATTEMPT_STATE_TIMED_OUT,
    job_pb2.ATTEMPT_STATE_CANCELLED,
    job_pb2.ATTEMPT_STATE_INFRA_ERROR,
}


def _caller(context: grpc.ServicerContext | None) -> Identity | None:
    """The machine the call's certificate names (None for a direct call in-process, or a
    development server without TLS, where the interceptor checks nothing either)."""
    return identity_of(context) if context is not None else None


def _for_itself(context: grpc.ServicerContext | None, machine_id: str) -> None:
    """A machine reports, completes and uploads only for itself: refused before anything
    is read or written (a malformed id is bad input first, named as such)."""
    require(machine_id, "machine_id", JOB_ID, "machine id")
    require_self(_caller(context), machine_id)


class WorkerService(worker_service_pb2_grpc.WorkerServiceServicer):
    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        settings: Settings,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self.settings = settings
        # Jobs finished and retried by the completions reported here.
        self.outcomes = JobOutcomes(instruments)
        self.retry_policy = settings.retry_policy()
        store = open_checkpoint_store(settings.checkpoint_location(), settings.checkpoint_max_bytes)
        self.checkpoints = CheckpointService(sessions, clock, store)

    def PutCheckpointPart(
        self, request: worker_service_pb2.PutCheckpointPartRequest, context: grpc.ServicerContext
    ) -> worker_service_pb2.PutCheckpointPartResponse:
        _for_itself(context, request.machine_id)
        return worker_service_pb2.PutCheckpointPartResponse(received_bytes=self.checkpoints.put_part(request))

    def CommitCheckpoint(
        self, request: worker_service_pb2.CommitCheckpointRequest, context: grpc.ServicerContext
    ) -> job_pb2.Checkpoint:
        _for_itself(context, request.machine_id)
        return self.checkpoints.commit(request)

    def ReadCheckpoint(
        self, request: worker_service_pb2.ReadCheckpointRequest, context: grpc.ServicerContext
    ) -> worker_service_pb2.ReadCheckpointResponse:
        _for_itself(context, request.machine_id)
        data, eof = self.checkpoints.read(request)
        return worker_service_pb2.ReadCheckpointResponse(data=data, eof=eof)

    def ReportHeartbeat(
        self, request: worker_service_pb2.ReportHeartbeatRequest, context: grpc.ServicerContext
    ) -> worker_service_pb2.ReportHeartbeatResponse:
        machine_id = require(request.machine_id, "machine_id", JOB_ID, "machine id")
        _for_itself(context, machine_id)
        found = Violations()
        if request.HasField("gpu_health"):
            gpu_faults.validate(request.gpu_health, found)
        found.raise_if_any()
        now = self.clock.now()
        lease_until = now + timedelta(seconds=self.settings.attempt_lease_s)
        reported = {r.attempt_id: r.slot for r in request.running}
        cancel: list[str] = []
        with self.sessions() as session, session.begin():
            machine = session.get(models.Machine, machine_id)
            if machine is None:
                raise NotFound(f"no machine {machine_id!r}", field="machine_id")
            if machine.state == MachineState.DESTROYED.value:
                raise FailedPrecondition("machine is destroyed", field="machine_id")
            machine.worker_report_at = now
            if request.HasField("gpu_health"):
                # Before the leases: a critical fault ends the attempts, which then go back
                # to the worker as cancels below.
                gpu_faults.apply(
                    session,
                    machine,
                    request.gpu_health,
                    now,
                    policy=self.settings.gpu_fault_policy(),
                    outcomes=self.settings.outcome_policy(),
                )
            if machine.state == MachineState.BOOTING.value and transition(
                session,
                machine_id,
                MachineState.BOOTING,
                MachineState.READY,
                by=Actor.WORKER,
                why="the worker reported in",
                now=now,
            ):
                log.info("machine %s is ready", machine_id, extra={"fields": {"machine_id": machine_id}})
            if reported:
                attempts = session.execute(
                    select(models.Attempt, models.Job)
                    .join(models.Job, models.Job.id == models.Attempt.job_id)
                    .where(models.Attempt.id.in_(list(reported)))
                ).all()
                known = set()
                for attempt, job in attempts:
                    known.add(attempt.id)
                    if (
                        attempt.machine_id == machine_id
                        and attempt.state in LIVE_ATTEMPT_STATES
                        and not job.cancel_requested
                    ):
                        attempt.lease_expires_at = lease_until
                        if attempt.state == AttemptState.STARTING.value:
                            start_attempt_running(attempt, by=Mover.WORKER)
                        if job.state == JobState.DISPATCHING.value:
                            move_job(session, job, JobState.RUNNING, now, by=Mover.WORKER, message="running")
                    else:
                        cancel.append(attempt.id)
                cancel.extend(a for a in reported if a not in known)
            # What the machine no longer runs, it has freed: those slots are free now.
            session.execute(
                update(models.Attempt)
                .where(
                    models.Attempt.machine_id == machine_id,
                    models.Attempt.holds_slot.is_(True),
                    models.Attempt.id.not_in(list(reported) or [""]),
                )
                .values(holds_slot=False)
            )
        # lease_s: the machine fences its runners short of it (gpufleet.common.lease_fence).
        resp = worker_service_pb2.ReportHeartbeatResponse(
            cancel_attempt_ids=cancel, lease_s=self.settings.attempt_lease_s
        )
        resp.lease_expire_time.FromDatetime(lease_until)
        return resp

    def ReportCompletion(
        self, request: worker_service_pb2.ReportCompletionRequest, context: grpc.ServicerContext
    ) -> worker_service_pb2.ReportCompletionResponse:
        machine_id = require(request.machine_id, "machine_id", JOB_ID, "machine id")
        _for_itself(context, machine_id)
        found = Violations()
        attempt_id = require(request.attempt_id, "attempt_id", JOB_ID, "attempt id", found)
        if request.outcome not in _REPORTABLE:
            found.add("outcome", "must be an ended attempt state", "UNKNOWN_VALUE")
        if request.slot_seconds < 0:
            found.add("slot_seconds", "must not be negative", "OUT_OF_RANGE")
        found.raise_if_any()
        now = self.clock.now()
        tally = OutcomeTally()
        with self.sessions() as session, session.begin():
            # Locked: a reaper or sweeper ending it LOST meanwhile must not be overwritten.
            attempt = session.get(models.Attempt, attempt_id, with_for_update=True)
            if attempt is None:
                raise NotFound(f"no attempt {attempt_id!r}", field="attempt_id")
            if attempt.machine_id != machine_id:
                raise FailedPrecondition("attempt runs on another machine", field="machine_id")
            if attempt.state in LIVE_ATTEMPT_STATES:
                self._finish(session, attempt, request, now, tally)
            # The machine says the process is gone: its slot is free.
            attempt.holds_slot = False
            response = worker_service_pb2.ReportCompletionResponse(attempt=attempt_to_proto(attempt))
        self.outcomes.committed(tally)  # a repeated completion ended nothing: nothing counted
        return response

    def _finish(
        self,
        session: Session,
        attempt: models.Attempt,
        request: worker_service_pb2.ReportCompletionRequest,
        now: datetime,
        tally: OutcomeTally,
    ) -> None:
        """The worker's word on how the attempt ended: the job lifecycle decides the rest
        (a failure on our side costs nothing and is retried patiently — on the disruption
        budget when the agent says the platform stopped a job running well; the job's own
        outcome is charged)."""
        outcome = AttemptState(enum_name(job_pb2.AttemptState, "ATTEMPT_STATE_", request.outcome))
        cause = cause_of_report(outcome, slot_not_closed=request.slot_not_closed, disrupted=request.disrupted)
        attempt.exit_code = request.exit_code
        machine_id = attempt.machine_id
        detail = f"attempt {attempt.id} on {machine_id}: exit {request.exit_code} {request.message}".strip()
        ended = end_attempt(
            session,
            attempt,
            cause,
            now,
            by=Mover.WORKER,
            policy=self.retry_policy,
            exit_code=request.exit_code,
            slot_seconds=request.slot_seconds,
            message=request.message,
            tally=tally,
        )
        if ended.update.ledger_class is not None:
            record_failure(
                session,
                now,
                ended.update.ledger_class,
                "runner",
                machine_id=machine_id,
                job_id=ended.job.id,
                attempt_id=attempt.id,
                details=detail,
            )

    def RegisterMachine(
        self, request: worker_service_pb2.RegisterMachineRequest, context: grpc.ServicerContext
    ) -> machine_pb2.Machine:
        require(request.request_id, "request_id", JOB_ID, "request id")
        caller = _caller(context)
        # A box registers as the machine its registration certificate names; without TLS
        # (development) an unnamed box gets an id derived from its request id.
        fallback = caller.machine_id if caller and caller.machine_id else None
        machine_id = request.machine_id or fallback or str(uuid.uuid5(uuid.NAMESPACE_URL, request.request_id))
        require(machine_id, "machine_id", JOB_ID, "machine id")
        require_self(caller, machine_id)
        found = Violations()
        validation.address(request.agent_address, "agent_address", found)
        require(request.pool, "pool", IDENT, "pool id", found)
        if request.workload_class not in machine_pb2.WorkloadClass.values():
            found.add("workload_class", f"unknown workload class {request.workload_class}", "UNKNOWN_VALUE")
        if request.slots < 1 or request.slots > 64:
            found.add("slots", "must be 1-64", "OUT_OF_RANGE")
        found.raise_if_any()
        now = self.clock.now()
        with self.sessions() as session, session.begin():
            if session.get(models.Pool, request.pool) is None:
                raise NotFound(f"unknown pool {request.pool!r}", field="pool")
            machine = session.get(models.Machine, machine_id)
            if machine is not None and machine.origin != MachineOrigin.REGISTERED.value:
                raise FailedPrecondition("a provisioned machine cannot register", field="machine_id")
            if machine is None:
                wl = (
                    WorkloadClass.SILENT
                    if request.workload_class == machine_pb2.WORKLOAD_CLASS_SILENT
                    else WorkloadClass.REPORTING
                )
                machine = models.Machine(
                    id=machine_id,
                    pool_id=request.pool,
                    provider="LOCAL",
                    slots=request.slots,
                    origin=MachineOrigin.REGISTERED.value,
                    managed=False,
                    workload_class=wl.value,
                    state=MachineState.READY.value,
                    state_changed_by=Actor.WORKER.value,
                    state_reason=f"registered itself at {request.agent_address}"[:500],
                    intent=MachineIntent.RUNNING.value,
                    agent_address=request.agent_address,
                    requested_at=now,
                    state_changed_at=now,
                    first_observed_at=now,
                    lost=False,
                    cordoned=False,
                    preemption_count=0,
                    spot_seconds=0.0,
                    start_failures=0,
                    hourly_price_micros=0,
                    gpu_count=1,
                    capacity_type="ON_DEMAND",
                    region="",
                    zone="",
                    instance_type="registered",
                    gpu_model="",
                )
                session.add(machine)
            else:
                machine.agent_address = request.agent_address
            session.flush()
            return machine_to_proto(machine)
