"""Inventory reconcile: the provider liveness channel and the machines the provider took
back (DESIGN §3, §4, §6; every 60 s).

Reads every provider's own instance list (through the provisioner, with no transaction
open) and, for each machine whose recorded intent is RUNNING:

- listed as running: writes ``provider_seen_at`` (the provider channel);
- a SPOT instance the provider stopped, terminated or no longer lists, while the machine
  runs here (BOOTING, READY, DRAINING): a pre-emption — see :mod:`machine_loss`;
- an ON_DEMAND instance that vanished (or that someone other than us stopped): the
  machine is lost the same way, without counting as a pre-emption.

Rules that keep it from doing harm:

- It never acts on a machine whose intent is not RUNNING, so a deliberate stop is never
  undone, nor counted as a pre-emption. A REGISTERED box is never touched.
- A provider that could not be listed this round changes nothing for its machines:
  absence from a list that could not be read proves nothing.
- A machine whose state changed after the list was read (a start that just finished) is
  not judged by that older list; an instance merely missing from the list is confirmed
  with a fresh read of that one instance before anything is concluded.
- A machine never listed whose create was requested less than ``not_listed_grace`` ago
  is *not yet listed* (:func:`gpufleet.common.lifecycle.not_yet_listed`): a provider's
  list lags its creates, so its absence proves nothing yet. The record is kept, nothing
  is re-created, one ``not_yet_listed`` ledger row says so, and the next pass looks again;
  after the grace the loss path above applies.
- The one machine it reads whose intent is not RUNNING: a SPOT machine recorded STOPPED
  that its provider lists RUNNING again — EC2 restarts an interrupted persistent spot
  instance by itself — follows the provider back to BOOTING (:mod:`spot_restart`).
- Conclusions (attempts ended, machines moved) are leader-only and fenced; a replica
  that is not the leader only writes the observation.

Each loss concluded (committed) is one observation of ``gpufleet.reaper.detection.latency``
with ``net="inventory_reconcile"``: the time from the last listing that showed the instance
running to the conclusion — how long the platform went on counting on a machine the
provider had taken back.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from opentelemetry import trace
from sqlalchemy import and_, func, literal, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import lifecycle
from gpufleet.common.convert import offering_of_machine
from gpufleet.common.db.enums import RUNNING_STATES, CapacityType, MachineIntent, MachineOrigin, MachineState
from gpufleet.common.db.models import Machine, UTCDateTime
from gpufleet.common.errors import GpufleetError
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import OutcomePolicy
from gpufleet.common.metrics.catalog import REAPER_DETECTION_LATENCY
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.provider_errors import InstanceNotFound
from gpufleet.sweeper.listing import ListedInstance, Provisioner, provider_name
from gpufleet.sweeper.machine_loss import LossKind, MachineLoss, apply_loss, classify_loss
from gpufleet.sweeper.not_yet_listed import record_not_yet_listed
from gpufleet.sweeper.spot_restart import Restarted, apply_restart, restarted_by_provider
from gpufleet.sweeper.sweeps import SweepResult

log = logging.getLogger(__name__)

NAME = "inventory_reconcile"


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
    capacity_type: str = "ON_DEMAND"
    state_changed_at: datetime | None = None
    provider_seen_at: datetime | None = None
    requested_at: datetime | None = None


@dataclass
class ReconcileDecision:
    """Which machines the provider vouched for, which it took back, which were left alone."""

    seen: list[str] = field(default_factory=list)
    losses: list[MachineLoss] = field(default_factory=list)
    # Their provider could not be listed: no change this round.
    provider_unreachable: list[str] = field(default_factory=list)
    # Intent is not RUNNING, or not ours: never acted on.
    not_reconciled: list[str] = field(default_factory=list)
    # Not running at the provider, but nothing can be concluded yet (the instance is
    # pending or stopping, the machine is mid-transition, or changed after the list).
    unsettled: list[str] = field(default_factory=list)
    # Missing from the list within the grace after its create: kept, looked for again.
    not_yet_listed: list[str] = field(default_factory=list)
    # Spot machines recorded stopped that the provider runs again by itself.
    restarted: list[Restarted] = field(default_factory=list)


def reconcilable(m: ReconcileMachine) -> bool:
    return (
        m.intent == MachineIntent.RUNNING
        and m.managed
        and m.origin == MachineOrigin.PROVISIONED
        and m.state != MachineState.DESTROYED
    )


def decide(
    listed_at: datetime,
    machines: Iterable[ReconcileMachine],
    instances: Iterable[ListedInstance],
    unreachable: Iterable[str],
    not_listed_grace: timedelta = timedelta(0),
) -> ReconcileDecision:
    """Match machines to listed instances by (provider, instance id), else by our label.

    ``listed_at`` is when the list was read: a machine whose state changed after it is
    not judged by it, nor one missing from it that is not yet listed (its create less
    than ``not_listed_grace`` before the list, and never listed since).
    """
    by_id = {(i.provider, i.provider_instance_id): i for i in instances if i.provider_instance_id}
    by_label = {(i.provider, i.machine_label): i for i in by_id.values() if i.machine_label}
    down = set(unreachable)
    decision = ReconcileDecision()
    for m in machines:
        inst = by_id.get((m.provider, m.provider_instance_id or "")) or by_label.get(
            (m.provider, m.machine_id)
        )
        status = inst.status if inst is not None else ""
        if not reconcilable(m):
            if inst is not None and restarted_by_provider(
                state=m.state,
                intent=m.intent,
                capacity_type=m.capacity_type,
                managed=m.managed,
                origin=m.origin,
                state_changed_at=m.state_changed_at,
                listed_status=status,
                listed_at=listed_at,
            ):
                assert m.state_changed_at is not None
                decision.restarted.append(
                    Restarted(m.machine_id, m.state_changed_at, inst.provider_instance_id, inst.agent_address)
                )
            else:
                decision.not_reconciled.append(m.machine_id)
            continue
        if m.provider in down:
            decision.provider_unreachable.append(m.machine_id)
            continue
        if status == "RUNNING":
            decision.seen.append(m.machine_id)
            continue
        if inst is None and lifecycle.not_yet_listed(
            m.requested_at, m.provider_seen_at, listed_at, not_listed_grace
        ):
            decision.not_yet_listed.append(m.machine_id)
            continue
        loss = classify_loss(m.capacity_type, status, inst is not None and inst.stopped_by_itself)
        if (
            loss is None
            or m.state not in RUNNING_STATES
            or m.state_changed_at is None
            or m.state_changed_at > listed_at
        ):
            decision.unsettled.append(m.machine_id)
            continue
        kind, end_state = loss
        decision.losses.append(
            MachineLoss(
                machine_id=m.machine_id,
                kind=kind,
                end_state=end_state,
                provider_status=status,
                state=m.state,
                state_changed_at=m.state_changed_at,
                last_known_running=m.provider_seen_at or m.state_changed_at,
            )
        )
    return decision


class InventoryReconcile:
    name = NAME

    def __init__(
        self,
        sessions: sessionmaker[Session],
        provider: Provisioner,
        *,
        outcomes: OutcomePolicy | None = None,
        not_listed_grace: timedelta = timedelta(minutes=10),
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.provider = provider
        self.outcomes = outcomes or OutcomePolicy()
        self.not_listed_grace = not_listed_grace
        self._latency = instruments.histogram(REAPER_DETECTION_LATENCY)

    def scan(self) -> list[ReconcileMachine]:
        """One query: machines we provisioned, manage and want running, not destroyed —
        and the spot machines recorded stopped (the provider may restart them)."""
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
                    Machine.capacity_type,
                    Machine.state_changed_at,
                    Machine.provider_seen_at,
                    Machine.requested_at,
                ).where(
                    Machine.state != MachineState.DESTROYED.value,
                    or_(
                        Machine.intent == MachineIntent.RUNNING.value,
                        # A spot machine the cloud stopped may be restarted by it.
                        and_(
                            Machine.state == MachineState.STOPPED.value,
                            Machine.intent == MachineIntent.STOPPED.value,
                            Machine.capacity_type == CapacityType.SPOT.value,
                        ),
                    ),
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
                capacity_type=r[7],
                state_changed_at=r[8],
                provider_seen_at=r[9],
                requested_at=r[10],
            )
            for r in rows
        ]

    def reconcile(self, now: datetime, lease: LeaderLease | None) -> SweepResult:
        """List, decide, write. ``lease`` (the leader's) fences every write and allows
        conclusions; None (RunSweep on a replica that does not lead) writes only the
        observation, which only ever moves a timestamp forward."""
        result = SweepResult(started_at=now)
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
        result.unreachable = [provider_name(p) for p in down]
        result.instances_seen = len(instances)
        decision = decide(now, self.scan(), instances, result.unreachable, self.not_listed_grace)
        seen = self._write_seen(now, decision.seen, lease)
        result.report.actions["provider_seen"] += seen
        if decision.not_yet_listed:
            result.report.refusals["NOT_YET_LISTED"] += len(decision.not_yet_listed)
            span.add_event(
                "refused",
                {
                    "gpufleet.net": NAME,
                    "gpufleet.gate": "NOT_YET_LISTED",
                    "gpufleet.machines": len(decision.not_yet_listed),
                },
            )
            log.info(
                "%s: not yet listed, kept and looked for again: %s", NAME, ", ".join(decision.not_yet_listed)
            )
            if lease is not None:
                written = record_not_yet_listed(
                    self.sessions, lease, now, decision.not_yet_listed, self.not_listed_grace, detector=NAME
                )
                result.report.actions["not_yet_listed"] += written
        restarted = self._restarted(now, decision.restarted, lease, result) if decision.restarted else 0
        losses = self._conclude(now, decision.losses, lease, result) if decision.losses else []
        result.machines_updated = seen + len(losses) + restarted
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
            f"{result.instances_seen} instances listed, {seen} machines seen running"
            + "".join(f"; {n} {kind.value.lower().replace('_', ' ')}" for kind, n in _count(losses))
            + (f"; {restarted} spot restarted by the provider" if restarted else "")
            + (
                f"; {refused} losses left to the leader"
                if (refused := result.report.refusals["NOT_LEADER"])
                else ""
            )
            + (f"; unreachable: {', '.join(result.unreachable)}" if result.unreachable else "")
        )
        return result

    def _conclude(
        self, now: datetime, losses: Sequence[MachineLoss], lease: LeaderLease | None, result: SweepResult
    ) -> list[MachineLoss]:
        """Confirm what needs confirming with a fresh read, then apply each loss (leader only)."""
        span = trace.get_current_span()
        if lease is None:
            result.report.refusals["NOT_LEADER"] += len(losses)
            span.add_event("refused", {"gpufleet.net": NAME, "gpufleet.gate": "NOT_LEADER"})
            return []
        applied: list[MachineLoss] = []
        for loss in losses:
            confirmed = self._confirm(loss) if loss.provider_status == "" else loss
            if confirmed is None:
                result.report.refusals["NOT_CONFIRMED"] += 1
                span.add_event(
                    "refused",
                    {
                        "gpufleet.net": NAME,
                        "gpufleet.gate": "NOT_CONFIRMED",
                        "gpufleet.machine": loss.machine_id,
                    },
                )
                continue
            outcome = apply_loss(
                self.sessions,
                lease,
                now,
                confirmed,
                detector=NAME,
                outcomes=self.outcomes,
            )
            if outcome is None:
                result.report.refusals["CHANGED_SINCE_SCAN"] += 1
                continue
            if confirmed.last_known_running is not None:
                seconds = max(0.0, (now - confirmed.last_known_running).total_seconds())
                self._latency.record(seconds, {"net": NAME})
            result.report.actions[confirmed.kind.value.lower()] += 1
            result.report.actions["attempts_lost"] += len(outcome)
            applied.append(confirmed)
        return applied

    def _confirm(self, loss: MachineLoss) -> MachineLoss | None:
        """An instance missing from the list: read it once more, by itself, before
        concluding. None when the read disagrees (it runs) or fails (no conclusion)."""
        with self.sessions() as session:
            machine = session.get(Machine, loss.machine_id)
            if machine is None:
                return None
            offering = offering_of_machine(machine)
            instance_id = machine.provider_instance_id or ""
            capacity_type = machine.capacity_type
        try:
            inst = self.provider.get(loss.machine_id, offering, instance_id)
        except InstanceNotFound:
            return loss
        except GpufleetError as err:
            log.warning("%s: could not confirm machine %s is gone: %s", NAME, loss.machine_id, err)
            return None
        listed = ListedInstance.from_proto(inst)
        status = listed.status
        again = classify_loss(capacity_type, status, listed.stopped_by_itself)
        if again is None:
            log.info("%s: machine %s is %s after all; nothing concluded", NAME, loss.machine_id, status)
            return None
        kind, end_state = again
        return MachineLoss(
            machine_id=loss.machine_id,
            kind=kind,
            end_state=end_state,
            provider_status=status,
            state=loss.state,
            state_changed_at=loss.state_changed_at,
            last_known_running=loss.last_known_running,
        )

    def _restarted(
        self, now: datetime, restarted: Sequence[Restarted], lease: LeaderLease | None, result: SweepResult
    ) -> int:
        """Each spot machine the provider runs again follows it (leader only)."""
        if lease is None:
            result.report.refusals["NOT_LEADER"] += len(restarted)
            return 0
        done = 0
        for each in restarted:
            if apply_restart(self.sessions, lease, now, each, detector=NAME):
                result.report.actions["spot_restarted"] += 1
                done += 1
            else:
                result.report.refusals["CHANGED_SINCE_SCAN"] += 1
        return done

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


def _count(losses: Sequence[MachineLoss]) -> list[tuple[LossKind, int]]:
    return [(kind, n) for kind in LossKind if (n := sum(1 for x in losses if x.kind is kind))]
