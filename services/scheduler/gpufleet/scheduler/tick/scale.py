"""The scale step's writes: intent in one fenced transaction, provider calls in the pool.

A create is recorded as a machine row in ``PROVISIONING`` and a start as ``STARTING``,
each with ``pending_call`` set, before any call is made; the tick then returns. A worker of
the :class:`~gpufleet.common.calls.CallPool` makes the call and records its answer
in a new transaction with a compare-and-set on the state it left (``WHERE state =
'PROVISIONING'``), not fenced by the epoch: what the provider did is a fact whoever asked,
so a create whose answer arrives after leadership moved is still recorded, never left
PROVISIONING. A new leader re-issues every call still marked pending (:meth:`adopt`); the
drivers are idempotent by machine id, so the instance the old leader started is adopted,
never created twice.

Outcomes go through the ledger: each refusal is one row whose routed outcome (quarantine
for a stockout, halt for quota and auth, an incident) takes effect in
:func:`~gpufleet.common.ledger.apply_outcome` with the shared TTLs of ``OutcomePolicy``.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import idle_timers
from gpufleet.common.call_failures import Op, decide_call_failure
from gpufleet.common.calls import CallPool, Outcomes
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import Clock
from gpufleet.common.convert import offering_of_machine
from gpufleet.common.db import models
from gpufleet.common.db.enums import MachineIntent, MachineOrigin, MachineState, WorkloadClass
from gpufleet.common.errors import FailedPrecondition, GpufleetError, InvalidArgument
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, OutcomePolicy, record_failure
from gpufleet.common.lifecycle import Actor, record, transition
from gpufleet.common.loops import TickReport
from gpufleet.common.provider_errors import AuthFailed, InsufficientCapacity, QuotaExceeded
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.idle_timers import IdleTimerClears
from gpufleet.scheduler.tick.model import CreateMachine, StartMachine

log = logging.getLogger(__name__)

CREATE: Op = "create"
START: Op = "start"


def is_definitive(exc: GpufleetError) -> bool:
    """The provider refused outright, or the provisioner did before calling one (a
    provider or region it does not run, a request it finds invalid): nothing was created
    or started, so nothing may count as capacity on its way."""
    return isinstance(
        exc, InsufficientCapacity | QuotaExceeded | AuthFailed | FailedPrecondition | InvalidArgument
    )


def refusal_class(exc: GpufleetError) -> FailureClass:
    if isinstance(exc, InsufficientCapacity):
        return FailureClass.STOCKOUT
    if isinstance(exc, QuotaExceeded):
        return FailureClass.QUOTA_EXCEEDED
    if isinstance(exc, AuthFailed):
        return FailureClass.AUTH_FAILED
    if isinstance(exc, FailedPrecondition):  # the provisioner runs no driver for it
        return FailureClass.PROVIDER_NOT_SERVED
    return FailureClass.PROVIDER_CALL_FAILED


def answered_values(
    call: str, seen: datetime, provider_instance_id: str, agent_address: str
) -> dict[str, Any]:
    """The columns a create's or start's answer writes as the machine moves to BOOTING,
    decided once (the scale step's writer and the simulator apply them): first observed
    at the answer (its boot window and this life begin there), the address the provider
    gave (kept when it gave none), no call pending — and for a start a new life: its
    back-off over, and nothing observed in the last life (lost, failing probes, a start-up
    failure) describing it any more."""
    values: dict[str, Any] = {"first_observed_at": seen, "pending_call": None, "pending_call_at": None}
    if agent_address:
        values["agent_address"] = agent_address
    if call == CREATE:
        values["provider_instance_id"] = provider_instance_id
        return values
    return values | {
        "start_failures": 0,
        "backoff_until": None,
        "lost": False,
        "probe_failed_since": None,
        "startup_failed_at": None,
    }


def create_values(for_job: str | None, now: datetime, provision_deadline_s: float) -> dict[str, Any]:
    """The columns a create's intent records beside what its offering gives (the row is born
    PROVISIONING), decided once (the scale step's writer and the simulator apply them): the
    intent, nothing lost, cordoned or failed yet, the provision deadline fixed at the
    request, the call pending, and the film it is created for (if any)."""
    return {
        "intent": MachineIntent.RUNNING.value,
        "lost": False,
        "cordoned": False,
        "requested_at": now,
        "provision_deadline_at": now + timedelta(seconds=provision_deadline_s),
        "state_changed_at": now,
        "preemption_count": 0,
        "spot_seconds": 0.0,
        "start_failures": 0,
        "pending_call": CREATE,
        "pending_call_at": now,
        "dispatch_failures": 0,
        "earmarked_for": for_job,
        "earmarked_at": now if for_job else None,
    }


def start_values(for_job: str | None, now: datetime) -> dict[str, Any]:
    """The columns a start's intent writes beside the move to STARTING, decided once (the
    scale step's writer and the simulator apply them): the intent, the film it is started
    for (if any), the call pending, both idle timers cleared (starting a machine for work
    clears them) — and a new life: nothing of it observed yet. The start's answer, or the
    first listing or probe of it, sets ``first_observed_at`` (a worker's report writes only
    its own clock); an earlier life's
    sighting would count this boot from a time before it began (the stuck-transition net
    finishing a start whose answer was lost keeps the sighting, as for a create)."""
    return {
        "intent": MachineIntent.RUNNING.value,
        "earmarked_for": for_job,
        "earmarked_at": now if for_job else None,
        "pending_call": START,
        "pending_call_at": now,
        **idle_timers.CLEARED,
        "first_observed_at": None,
    }


class ScaleController:
    """Records the scale step's intent and hands its provider calls to the pool."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        lease: LeaderLease,
        provisioner: ProvisionerClient,
        settings: Settings,
        calls: CallPool,
        outcomes: Outcomes,
        idle_timers: IdleTimerClears,
    ) -> None:
        self.sessions = sessions
        self.clock = clock
        self.lease = lease
        self.provisioner = provisioner
        self.settings = settings
        self.calls = calls
        self.outcomes = outcomes
        self.idle_timers = idle_timers
        self.policy: OutcomePolicy = settings.outcome_policy()

    def record(self, actions: list[StartMachine | CreateMachine], now: datetime, report: TickReport) -> None:
        """One fenced transaction for every create and start of this tick, then the calls.
        The started machines whose idle timers were set are counted ``cleared`` once it
        has committed."""
        if not actions:
            return
        submitted: list[tuple[str, str]] = []
        timers_cleared = 0
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            for action in actions:
                if isinstance(action, CreateMachine):
                    machine_id = self._record_create(session, action, now)
                    submitted.append((CREATE, machine_id))
                    report.actions["create"] += 1
                elif (started := self._record_start(session, action, now)) is not None:
                    submitted.append((START, action.machine_id))
                    report.actions["start"] += 1
                    timers_cleared += started
        self.idle_timers.committed(timers_cleared)
        for call, machine_id in submitted:
            self._submit(call, machine_id)

    def adopt(self, report: TickReport) -> None:
        """Re-issue each call the store marks pending that no worker here is making: a
        create or start the last leader (or this process before a restart) had in flight."""
        with self.sessions() as session:
            rows = session.execute(
                select(models.Machine.id, models.Machine.pending_call).where(
                    models.Machine.pending_call.is_not(None),
                    models.Machine.state.in_([MachineState.PROVISIONING.value, MachineState.STARTING.value]),
                )
            ).all()
        for machine_id, call in rows:
            if call in (CREATE, START) and self._submit(call, machine_id):
                report.actions[f"{call}_adopted"] += 1
                log.info("re-issuing the pending %s of machine %s", call, machine_id)

    def _submit(self, call: str, machine_id: str) -> bool:
        run = self._create if call == CREATE else self._start
        return self.calls.submit(f"{call}:{machine_id}", lambda: run(machine_id))

    # -- intent ------------------------------------------------------------------------
    def _record_create(self, session: Session, action: CreateMachine, now: datetime) -> str:
        machine_id = str(uuid.uuid4())
        offering = session.get_one(models.Offering, action.offering_id)
        session.add(
            models.Machine(
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
                state_changed_by=Actor.FLEET_TICK.value,
                state_reason=f"created for film {action.for_job}"
                if action.for_job
                else f"work is waiting in pool {action.pool_id}",
                **create_values(action.for_job, now, self.settings.provision_deadline_s),
            )
        )
        log.info(
            "creating machine %s from offering %s",
            machine_id,
            action.offering_id,
            extra={"fields": {"machine_id": machine_id, "offering": action.offering_id}},
        )
        return machine_id

    def _record_start(self, session: Session, action: StartMachine, now: datetime) -> int | None:
        """Record the start of a stopped machine; None when it is no longer one to start,
        else how many machines had idle timers set (1 or 0: its clear took them off)."""
        machine_id = action.machine_id
        # Locked: the state checked and the timers counted are the ones this start replaces.
        machine = session.get_one(models.Machine, machine_id, with_for_update=True)
        if (
            machine.state != MachineState.STOPPED.value
            or machine.intent == MachineIntent.DESTROYED.value
            # Cordoned since the snapshot (a GPU fault): never back as capacity.
            or machine.cordoned
        ):
            return None
        had_timers = machine.stop_due_at is not None or machine.destroy_due_at is not None
        why = f"started for film {action.for_job}" if action.for_job else "work is waiting"
        record(machine, MachineState.STARTING, by=Actor.FLEET_TICK, why=why, now=now)
        for column, value in start_values(action.for_job, now).items():
            setattr(machine, column, value)
        log.info("starting stopped machine %s", machine_id, extra={"fields": {"machine_id": machine_id}})
        return int(had_timers)

    # -- the calls (in the pool) ---------------------------------------------------------
    def _create(self, machine_id: str) -> None:
        with self.sessions() as session:
            machine = session.get(models.Machine, machine_id)
            if machine is None or machine.state != MachineState.PROVISIONING.value:
                return
            if not machine.pending_call:
                return
            offering_msg = offering_of_machine(machine)
        try:
            instance = self.provisioner.create(machine_id, offering_msg, request_id=f"{machine_id}:create")
        except GpufleetError as exc:  # a provider's refusal, or our own error: never the tick's
            self._refused(machine_id, MachineState.PROVISIONING, exc, CREATE)
            return
        seen = self.clock.now()
        with self.sessions() as session, session.begin():
            done = transition(
                session,
                machine_id,
                MachineState.PROVISIONING,
                MachineState.BOOTING,
                by=Actor.FLEET_TICK,
                why=f"created as {instance.provider_instance_id}",
                now=seen,
                **answered_values(CREATE, seen, instance.provider_instance_id, instance.agent_address),
            )
        self.outcomes.add("created" if done else "create_answer_superseded")

    def _start(self, machine_id: str) -> None:
        with self.sessions() as session:
            machine = session.get(models.Machine, machine_id)
            if machine is None or machine.state != MachineState.STARTING.value or not machine.pending_call:
                return
            offering_msg = offering_of_machine(machine)
            instance_id = machine.provider_instance_id or ""
            asked_at = machine.pending_call_at or machine.state_changed_at
        try:
            instance = self.provisioner.start(
                machine_id,
                offering_msg,
                instance_id,
                request_id=f"{machine_id}:start:{int(asked_at.timestamp())}",
            )
        except GpufleetError as exc:  # a provider's refusal, or our own error: never the tick's
            self._refused(machine_id, MachineState.STARTING, exc, START)
            return
        seen = self.clock.now()
        with self.sessions() as session, session.begin():
            done = transition(
                session,
                machine_id,
                MachineState.STARTING,
                MachineState.BOOTING,
                by=Actor.FLEET_TICK,
                why="started",
                now=seen,
                **answered_values(START, seen, instance.provider_instance_id, instance.agent_address),
            )
        self.outcomes.add("started" if done else "start_answer_superseded")

    def _refused(self, machine_id: str, left_in: MachineState, exc: GpufleetError, what: Op) -> None:
        """One ledger row for a failed create or start; the routed outcome takes effect
        through the ledger (a stockout quarantines the offering for the configured TTL,
        quota or auth halts the provider and region). When the provider definitively
        refused, nothing exists or runs: a create's record ends (DESTROYED), a start goes
        back to STOPPED. Otherwise the outcome is unknown and the machine stays in its
        transitional state, visible, for the stuck-transition watchdog. A failed start
        also waits out an exponential back-off before this machine is tried again."""
        now = self.clock.now()
        cls = refusal_class(exc)
        with self.sessions() as session, session.begin():
            machine = session.get(models.Machine, machine_id, with_for_update=True)
            if machine is None or machine.state != left_in.value:
                return
            failed = decide_call_failure(
                what,
                cls.value,
                is_definitive(exc),
                machine.start_failures,
                self.settings.start_backoff_s,
            )
            for column, value in failed.values(now).items():
                setattr(machine, column, value)
            record_failure(
                session,
                now,
                cls,
                "fleet_tick.scale",
                machine_id=machine.id,
                details=f"{what}{f' from {machine.offering_id}' if what == 'create' else ''} failed "
                f"({machine.provider} {machine.zone}): {exc}",
                apply=True,
                policy=self.policy,
            )
            if failed.end_state is not None:
                record(machine, failed.end_state, by=Actor.FLEET_TICK, why=failed.why, now=now)
        self.outcomes.add(f"{what}_failed_{cls.value}")
        log.warning("%s of machine %s failed: %s", what, machine_id, exc)
