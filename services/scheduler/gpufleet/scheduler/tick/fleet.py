"""Applies the fleet tick's plan. Every step records intent and commits before it calls a
provider or an agent, and records the outcome in a new transaction afterwards; every
write is fenced by the leader's epoch."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.attempts import requeue_after_loss
from gpufleet.common.clients.agent import AgentClient
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import Clock
from gpufleet.common.convert import dur, offering_of_machine
from gpufleet.common.db import models
from gpufleet.common.db.enums import (
    LIVE_ATTEMPT_STATES,
    AttemptState,
    JobState,
    MachineIntent,
    MachineOrigin,
    MachineState,
    QuarantineKind,
    WorkloadClass,
)
from gpufleet.common.errors import GpufleetError
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.loops import TickReport
from gpufleet.common.provider_errors import (
    AuthFailed,
    InsufficientCapacity,
    ProviderError,
    QuotaExceeded,
)
from gpufleet.scheduler.jobstate import end_attempt, set_job_state
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.decide import decide
from gpufleet.scheduler.tick.model import Assignment, CreateMachine, Policy, StartMachine
from gpufleet.scheduler.tick.snapshot import load_snapshot
from gpufleet.v1 import agent_service_pb2

log = logging.getLogger(__name__)

STOCKOUT_QUARANTINE_S = 1800.0


def is_definitive(exc: ProviderError) -> bool:
    """The provider refused outright: nothing was created or started."""
    return isinstance(exc, InsufficientCapacity | QuotaExceeded | AuthFailed)


def record_provider_refusal(
    session: Session, now: datetime, machine: models.Machine, exc: ProviderError, what: str
) -> FailureClass:
    """One ledger row for a failed create or start, classified from the typed error, and
    its effect on the scale step: a stockout quarantines the offering for a while (the next
    tick tries the next one); quota or auth halts that provider and region until a human
    clears it. Both open an incident through the ledger's routing."""
    cls = {
        InsufficientCapacity: FailureClass.STOCKOUT,
        QuotaExceeded: FailureClass.QUOTA_EXCEEDED,
        AuthFailed: FailureClass.AUTH_FAILED,
    }.get(type(exc), FailureClass.PROVIDER_CALL_FAILED)
    record_failure(
        session,
        now,
        cls,
        "fleet_tick.scale",
        machine_id=machine.id,
        details=f"{what} failed ({machine.provider} {machine.zone}): {exc}",
    )
    if isinstance(exc, InsufficientCapacity) and machine.offering_id:
        session.add(
            models.Quarantine(
                kind=QuarantineKind.OFFERING.value,
                offering_id=machine.offering_id,
                reason=f"stockout in {machine.zone}",
                created_at=now,
                expires_at=now + timedelta(seconds=STOCKOUT_QUARANTINE_S),
            )
        )
    elif isinstance(exc, QuotaExceeded | AuthFailed):
        session.add(
            models.Quarantine(
                kind=QuarantineKind.PROVIDER_REGION.value,
                provider=machine.provider,
                region=machine.region,
                reason=f"{cls.value}: {exc}",
                created_at=now,
            )
        )
    return cls


class FleetTick:
    """One leader's fleet tick; ``run(now)`` is called by the Ticker every ``tick_s``."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        lease: LeaderLease,
        provisioner: ProvisionerClient,
        settings: Settings,
        agent_factory: Callable[[str], AgentClient] = AgentClient,
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self.lease = lease
        self.provisioner = provisioner
        self.settings = settings
        self.agent_factory = agent_factory
        self.policy = Policy(
            max_running_machines=settings.max_running_machines, worker_fresh_s=settings.worker_fresh_s
        )

    def run(self, now: datetime) -> TickReport:
        report = TickReport()
        with self.sessions() as session:
            snapshot = load_snapshot(session, now, self.settings.fair_share_window_s)
        plan = decide(snapshot, self.policy)
        for attempt_id in plan.expired_leases:
            self._expire_lease(attempt_id, now, report)
        for attempt_id in plan.over_limit:
            self._time_out(attempt_id, now, report)
        for action in plan.scale:
            if isinstance(action, StartMachine):
                self._start(action.machine_id, report)
            else:
                self._create(action, report)
        for assignment in plan.assignments:
            self._assign(assignment, report)
        return report

    # -- leases and limits ---------------------------------------------------------------
    def _expire_lease(self, attempt_id: str, now: datetime, report: TickReport) -> None:
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            attempt = session.get(models.Attempt, attempt_id, with_for_update=True)
            if attempt is None or attempt.state not in LIVE_ATTEMPT_STATES or attempt.lease_expires_at >= now:
                return
            job = session.get_one(models.Job, attempt.job_id)
            kind = session.get_one(models.JobKind, job.kind_id)
            end_attempt(
                session,
                attempt,
                AttemptState.LOST,
                now,
                charged=False,
                message="lease expired: the machine stopped reporting",
            )
            record_failure(
                session,
                now,
                FailureClass.LEASE_EXPIRED,
                "fleet_tick",
                machine_id=attempt.machine_id,
                job_id=job.id,
                attempt_id=attempt.id,
                details=f"lease ran out at {attempt.lease_expires_at.isoformat()}",
            )
            requeue_after_loss(
                session, job, kind, now, self.settings.lost_retry_backoff_s, "machine lost (lease expired)"
            )
        report.actions["lease_expired"] += 1
        log.warning(
            "attempt %s lost: lease expired", attempt_id, extra={"fields": {"attempt_id": attempt_id}}
        )

    def _time_out(self, attempt_id: str, now: datetime, report: TickReport) -> None:
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            attempt = session.get(models.Attempt, attempt_id, with_for_update=True)
            if attempt is None or attempt.state not in LIVE_ATTEMPT_STATES:
                return
            job = session.get_one(models.Job, attempt.job_id)
            machine = session.get_one(models.Machine, attempt.machine_id)
            end_attempt(
                session,
                attempt,
                AttemptState.TIMED_OUT,
                now,
                charged=True,
                message="past its kind's time limit",
            )
            record_failure(
                session,
                now,
                FailureClass.JOB_TIMED_OUT,
                "fleet_tick",
                machine_id=machine.id,
                job_id=job.id,
                attempt_id=attempt.id,
                details="past its kind's time limit",
            )
            set_job_state(session, job, JobState.TIMED_OUT, now, "stopped: past its kind's time limit")
            address = machine.agent_address
        report.actions["timed_out"] += 1
        if address:
            self._tell_agent_cancel(address, attempt_id, "time limit")

    def _tell_agent_cancel(self, address: str, attempt_id: str, reason: str) -> None:
        try:
            with self.agent_factory(address) as agent:
                agent.cancel_job(attempt_id, reason)
        except GpufleetError as exc:
            log.warning(
                "cancel of %s on %s not delivered (%s); the next heartbeat repeats it",
                attempt_id,
                address,
                exc,
            )

    # -- scale -------------------------------------------------------------------------
    def _create(self, action: CreateMachine, report: TickReport) -> None:
        now = self.clock.now()
        machine_id = str(uuid.uuid4())
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            offering = session.get_one(models.Offering, action.offering_id)
            machine = models.Machine(
                id=machine_id,
                pool_id=action.pool_id,
                offering_id=offering.id,
                provider=offering.provider,
                region=offering.region,
                zone=offering.zone,
                instance_type=offering.instance_type,
                gpu_model=offering.gpu_model,
                gpu_count=offering.gpu_count,
                slots=offering.slots,
                capacity_type=offering.capacity_type,
                hourly_price_micros=offering.hourly_price_micros,
                origin=MachineOrigin.PROVISIONED.value,
                managed=True,
                workload_class=WorkloadClass.REPORTING.value,
                state=MachineState.PROVISIONING.value,
                intent=MachineIntent.RUNNING.value,
                lost=False,
                cordoned=False,
                requested_at=now,
                provision_deadline_at=now + timedelta(seconds=self.settings.provision_deadline_s),
                state_changed_at=now,
                preemption_count=0,
                spot_seconds=0.0,
                start_failures=0,
            )
            session.add(machine)
            offering_msg = offering_of_machine(machine)
        report.actions["create"] += 1
        log.info(
            "creating machine %s from offering %s",
            machine_id,
            action.offering_id,
            extra={"fields": {"machine_id": machine_id, "offering": action.offering_id}},
        )
        try:
            instance = self.provisioner.create(machine_id, offering_msg, request_id=f"{machine_id}:create")
        except ProviderError as exc:
            self._create_failed(machine_id, action, exc, report)
            return
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            machine = session.get_one(models.Machine, machine_id)
            if machine.state != MachineState.PROVISIONING.value:
                return  # something else (a watchdog) took over meanwhile
            seen = self.clock.now()
            machine.provider_instance_id = instance.provider_instance_id
            machine.agent_address = instance.agent_address or None
            machine.state = MachineState.BOOTING.value
            machine.state_changed_at = seen
            machine.first_observed_at = seen

    def _create_failed(
        self, machine_id: str, action: CreateMachine, exc: ProviderError, report: TickReport
    ) -> None:
        now = self.clock.now()
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            machine = session.get_one(models.Machine, machine_id)
            cls = record_provider_refusal(session, now, machine, exc, f"create from {action.offering_id}")
            if is_definitive(exc):
                # The provider says nothing was created: the record ends here.
                machine.state = MachineState.DESTROYED.value
                machine.intent = MachineIntent.DESTROYED.value
                machine.state_changed_at = now
        report.actions[f"create_failed_{cls.value}"] += 1
        log.warning("create of machine %s failed: %s", machine_id, exc)

    def _start(self, machine_id: str, report: TickReport) -> None:
        now = self.clock.now()
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            machine = session.get_one(models.Machine, machine_id)
            if machine.state != MachineState.STOPPED.value or machine.intent == MachineIntent.DESTROYED.value:
                return
            machine.intent = MachineIntent.RUNNING.value
            machine.state = MachineState.STARTING.value
            machine.state_changed_at = now
            # Starting a machine for work clears both idle timers.
            machine.stop_due_at = None
            machine.destroy_due_at = None
            offering_msg = offering_of_machine(machine)
            instance_id = machine.provider_instance_id or ""
        report.actions["start"] += 1
        log.info("starting stopped machine %s", machine_id, extra={"fields": {"machine_id": machine_id}})
        try:
            instance = self.provisioner.start(
                machine_id, offering_msg, instance_id, request_id=f"{machine_id}:start:{int(now.timestamp())}"
            )
        except ProviderError as exc:
            self._start_failed(machine_id, exc, report)
            return
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            machine = session.get_one(models.Machine, machine_id)
            if machine.state != MachineState.STARTING.value:
                return
            seen = self.clock.now()
            machine.state = MachineState.BOOTING.value
            machine.state_changed_at = seen
            machine.first_observed_at = seen
            machine.agent_address = instance.agent_address or machine.agent_address
            machine.start_failures = 0
            machine.backoff_until = None
            # A new life: what was observed in the last one no longer describes it.
            machine.lost = False
            machine.probe_failed_since = None
            machine.startup_failed_at = None

    def _start_failed(self, machine_id: str, exc: ProviderError, report: TickReport) -> None:
        """A start that failed waits out an exponential back-off before this machine is tried
        again. When the provider definitively refused (no capacity, quota, auth) the machine
        is still stopped: it goes back to STOPPED so it no longer counts as arriving and the
        next tick looks elsewhere. Otherwise the outcome is unknown and it stays STARTING,
        visible, for the stuck-transition watchdog."""
        now = self.clock.now()
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            machine = session.get_one(models.Machine, machine_id)
            machine.start_failures += 1
            machine.backoff_until = now + timedelta(
                seconds=self.settings.start_backoff_s * 2 ** (machine.start_failures - 1)
            )
            cls = record_provider_refusal(session, now, machine, exc, "start")
            if is_definitive(exc) and machine.state == MachineState.STARTING.value:
                machine.state = MachineState.STOPPED.value
                machine.intent = MachineIntent.STOPPED.value
                machine.state_changed_at = now
        report.actions[f"start_failed_{cls.value}"] += 1
        log.warning("start of machine %s failed: %s", machine_id, exc)

    # -- assign ------------------------------------------------------------------------
    def _assign(self, assignment: Assignment, report: TickReport) -> None:
        now = self.clock.now()
        attempt_id = str(uuid.uuid4())
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            job = session.get_one(models.Job, assignment.job_id)
            machine = session.get_one(models.Machine, assignment.machine_id)
            if job.state != JobState.QUEUED.value or machine.state != MachineState.READY.value:
                return
            taken = session.execute(
                select(models.Attempt.slot, models.Attempt.slots).where(
                    models.Attempt.machine_id == machine.id,
                    models.Attempt.state.in_([s.value for s in LIVE_ATTEMPT_STATES]),
                )
            ).all()
            busy = {s for slot, n in taken for s in range(slot, slot + n)}
            if busy & set(assignment.slots):
                return
            kind = session.get_one(models.JobKind, job.kind_id)
            session.add(
                models.Attempt(
                    id=attempt_id,
                    job_id=job.id,
                    machine_id=machine.id,
                    slot=assignment.slots[0],
                    slots=len(assignment.slots),
                    state=AttemptState.STARTING.value,
                    started_at=now,
                    lease_expires_at=now + timedelta(seconds=self.settings.attempt_lease_s),
                    slot_seconds=0.0,
                    charged=False,
                    charge_micros=0,
                    status_message="",
                    epoch=self.lease.epoch or 0,
                )
            )
            job.attempt_count += 1
            set_job_state(
                session,
                job,
                JobState.DISPATCHING,
                now,
                f"attempt {job.attempt_count} on machine {machine.id} slot {assignment.slots[0]}",
            )
            # The scheduler never races the money chain: work assigned clears both timers.
            session.execute(
                update(models.Machine)
                .where(models.Machine.id == machine.id)
                .values(stop_due_at=None, destroy_due_at=None)
            )
            request = agent_service_pb2.AgentServiceStartJobRequest(
                request_id=attempt_id,
                attempt_id=attempt_id,
                job_id=job.id,
                slot=assignment.slots[0],
                kind=job.kind_id,
                pipeline_version=job.pipeline_version,
                tenant_values=job.tenant_values or {},
                time_limit=dur(kind.time_limit_s),
                workspace=job.workspace_id,
                slots=len(assignment.slots),
                # A kind that runs a writer's code gets no network but its tunnels.
                outbound_network=not kind.runs_writer_code,
                memory_limit_bytes=kind.memory_limit_mb << 20,
                pids_limit=kind.pids_limit,
            )
            address = machine.agent_address or ""
        report.actions["assign"] += 1
        try:
            with self.agent_factory(address) as agent:
                agent.start_job(request)
        except GpufleetError as exc:
            self._start_job_failed(attempt_id, str(exc), report)
            return
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            attempt = session.get_one(models.Attempt, attempt_id)
            if attempt.state == AttemptState.STARTING.value:
                attempt.state = AttemptState.RUNNING.value
            job = session.get_one(models.Job, attempt.job_id)
            if job.state == JobState.DISPATCHING.value:
                set_job_state(session, job, JobState.RUNNING, self.clock.now(), "running")

    def _start_job_failed(self, attempt_id: str, why: str, report: TickReport) -> None:
        now = self.clock.now()
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            attempt = session.get_one(models.Attempt, attempt_id)
            if attempt.state not in LIVE_ATTEMPT_STATES:
                return
            job = session.get_one(models.Job, attempt.job_id)
            kind = session.get_one(models.JobKind, job.kind_id)
            end_attempt(
                session,
                attempt,
                AttemptState.INFRA_ERROR,
                now,
                charged=False,
                message=f"agent refused the job: {why}",
            )
            record_failure(
                session,
                now,
                FailureClass.JOB_INFRA_ERROR,
                "fleet_tick.assign",
                machine_id=attempt.machine_id,
                job_id=job.id,
                attempt_id=attempt.id,
                details=why,
            )
            requeue_after_loss(
                session, job, kind, now, self.settings.retry_backoff_s, "could not start on the machine"
            )
        report.actions["start_job_failed"] += 1
