"""Inventory reconcile: the provider liveness channel (DESIGN §3, §4; every 60 s).

Reads every provider's own instance list (through the provisioner, with no transaction
open) and, for each machine whose recorded intent is RUNNING, writes ``provider_seen_at``
when its instance is listed as running. Three rules keep it from doing harm:

- It never acts on a machine whose intent is not RUNNING, so a deliberate stop is never
  undone (or even touched) by the next reconcile.
- It never writes the provider channel of a REGISTERED box: nobody here provisioned it, so
  the provider has nothing to say about it.
- A provider that could not be listed this round changes nothing for its machines:
  absence from a list that could not be read proves nothing.

Seam for the next issue: :func:`decide` is where pre-emptions and vanished instances will
be recognised (an intent-RUNNING machine whose instance is listed as stopped/terminated,
or not listed at all by a reachable provider); the orphan sweep reads the same listing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from opentelemetry import trace
from sqlalchemy import func, literal, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.convert import enum_name
from gpufleet.common.db.enums import MachineIntent, MachineOrigin, MachineState
from gpufleet.common.db.models import Machine, UTCDateTime
from gpufleet.common.errors import GpufleetError
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import TickReport
from gpufleet.v1 import machine_pb2, provisioner_service_pb2

log = logging.getLogger(__name__)

NAME = "inventory_reconcile"
MACHINE_LABEL = "gpufleet-machine"


@dataclass(frozen=True)
class ReconcileMachine:
    """What the scan read about one machine (``managed`` always beside state and intent)."""

    machine_id: str
    provider: str
    provider_instance_id: str | None
    origin: str
    managed: bool
    state: str
    intent: str


@dataclass(frozen=True)
class ListedInstance:
    """One instance from a provider's list, reduced to what matching needs."""

    provider: str
    provider_instance_id: str
    machine_label: str | None
    status: str

    @classmethod
    def from_proto(cls, inst: provisioner_service_pb2.Instance) -> ListedInstance:
        label = inst.labels.get(MACHINE_LABEL) or inst.machine_id or None
        return cls(
            provider=enum_name(machine_pb2.Provider, "PROVIDER_", inst.provider),
            provider_instance_id=inst.provider_instance_id,
            machine_label=label,
            status=enum_name(provisioner_service_pb2.InstanceStatus, "INSTANCE_STATUS_", inst.status),
        )


@dataclass
class ReconcileDecision:
    """Which machines the provider vouched for, and which were left alone and why."""

    seen: list[str] = field(default_factory=list)
    # Their provider could not be listed: no change this round.
    provider_unreachable: list[str] = field(default_factory=list)
    # Intent is not RUNNING, or not ours: never acted on.
    not_reconciled: list[str] = field(default_factory=list)


def reconcilable(m: ReconcileMachine) -> bool:
    return (
        m.intent == MachineIntent.RUNNING
        and m.managed
        and m.origin == MachineOrigin.PROVISIONED
        and m.state != MachineState.DESTROYED
    )


def decide(
    machines: Iterable[ReconcileMachine], instances: Iterable[ListedInstance], unreachable: Iterable[str]
) -> ReconcileDecision:
    """Match machines to listed instances by (provider, instance id), else by our label."""
    by_id = {(i.provider, i.provider_instance_id): i for i in instances if i.provider_instance_id}
    by_label = {(i.provider, i.machine_label): i for i in by_id.values() if i.machine_label}
    down = set(unreachable)
    decision = ReconcileDecision()
    for m in machines:
        if not reconcilable(m):
            decision.not_reconciled.append(m.machine_id)
            continue
        if m.provider in down:
            decision.provider_unreachable.append(m.machine_id)
            continue
        inst = by_id.get((m.provider, m.provider_instance_id or "")) or by_label.get(
            (m.provider, m.machine_id)
        )
        if inst is not None and inst.status == "RUNNING":
            decision.seen.append(m.machine_id)
        # Not listed, or listed but not running: pre-emption/vanished detection (next issue).
    return decision


class InstanceLister(Protocol):
    """``ProvisionerClient`` satisfies it: every instance labelled with our deployment,
    plus the providers (numbers) that could not be listed."""

    def list_all(self, provider: int = 0) -> tuple[list[provisioner_service_pb2.Instance], list[int]]: ...


@dataclass
class ReconcileResult:
    started_at: datetime
    instances_seen: int = 0
    machines_updated: int = 0
    unreachable: list[str] = field(default_factory=list)
    summary: str = ""
    report: TickReport = field(default_factory=TickReport)


class InventoryReconcile:
    name = NAME

    def __init__(self, sessions: sessionmaker[Session], provider: InstanceLister) -> None:
        self.sessions = sessions
        self.provider = provider

    def scan(self) -> list[ReconcileMachine]:
        """One query: machines we provisioned, manage and want running, not destroyed."""
        with self.sessions() as session:
            rows = session.execute(
                select(
                    Machine.id,
                    Machine.provider,
                    Machine.provider_instance_id,
                    Machine.origin,
                    Machine.managed,
                    Machine.state,
                    Machine.intent,
                ).where(
                    Machine.state != MachineState.DESTROYED.value,
                    Machine.intent == MachineIntent.RUNNING.value,
                    Machine.managed.is_(True),
                    Machine.origin == MachineOrigin.PROVISIONED.value,
                )
            ).all()
        return [
            ReconcileMachine(
                machine_id=r[0],
                provider=r[1],
                provider_instance_id=r[2],
                origin=r[3],
                managed=r[4],
                state=r[5],
                intent=r[6],
            )
            for r in rows
        ]

    def reconcile(self, now: datetime, lease: LeaderLease | None) -> ReconcileResult:
        """List, decide, write. ``lease`` fences the write (the Ticker's path); None is the
        manual RunSweep path, whose only write is a monotonic observation (see service)."""
        result = ReconcileResult(started_at=now)
        span = trace.get_current_span()
        try:
            listed, down = self.provider.list_all()
        except GpufleetError as err:
            result.summary = f"provisioner could not list instances: {err}; nothing changed"
            result.report.refusals["PROVISIONER_UNREACHABLE"] += 1
            span.add_event("refused", {"gpufleet.net": NAME, "gpufleet.gate": "PROVISIONER_UNREACHABLE"})
            log.warning("%s: %s", NAME, result.summary)
            return result
        instances = [ListedInstance.from_proto(i) for i in listed]
        result.unreachable = [enum_name(machine_pb2.Provider, "PROVIDER_", p) for p in down]
        result.instances_seen = len(instances)
        decision = decide(self.scan(), instances, result.unreachable)
        result.machines_updated = self._write_seen(now, decision.seen, lease)
        result.report.actions["provider_seen"] += result.machines_updated
        if decision.provider_unreachable:
            result.report.refusals["PROVIDER_UNREACHABLE"] += len(decision.provider_unreachable)
            span.add_event(
                "refused",
                {
                    "gpufleet.net": NAME,
                    "gpufleet.gate": "PROVIDER_UNREACHABLE",
                    "gpufleet.machines": len(decision.provider_unreachable),
                },
            )
            log.info(
                "%s: providers %s could not be listed; %d machines left unchanged",
                NAME,
                ",".join(result.unreachable),
                len(decision.provider_unreachable),
            )
        result.summary = (
            f"{result.instances_seen} instances listed, {result.machines_updated} machines "
            f"seen running"
            + (f"; unreachable: {', '.join(result.unreachable)}" if result.unreachable else "")
        )
        return result

    def _write_seen(self, now: datetime, machine_ids: Sequence[str], lease: LeaderLease | None) -> int:
        if not machine_ids:
            return 0
        with self.sessions() as session, session.begin():
            if lease is not None:
                lease.fence(session)
            # The conditions are re-checked in the write: a machine stopped on purpose since
            # the scan is left alone. provider_seen_at only moves forward, so a late write
            # from a slow or paused replica can never make a machine look older.
            result = session.execute(
                update(Machine)
                .where(
                    Machine.id.in_(list(machine_ids)),
                    Machine.intent == MachineIntent.RUNNING.value,
                    Machine.managed.is_(True),
                    Machine.origin == MachineOrigin.PROVISIONED.value,
                    Machine.state != MachineState.DESTROYED.value,
                    or_(Machine.provider_seen_at.is_(None), Machine.provider_seen_at < now),
                )
                .values(
                    provider_seen_at=now,
                    first_observed_at=func.coalesce(Machine.first_observed_at, literal(now, UTCDateTime())),
                )
                .execution_options(synchronize_session=False)
            )
            return int(getattr(result, "rowcount", 0) or 0)
