"""The orphan sweep: their list, not ours (DESIGN §4; every 5 min).

An instance that exists at the provider with nothing recorded here is invisible to every
net that starts from our own inventory; only reading the provider's list finds it. Each
round compares the provisioner's list — only instances labelled with our deployment —
against every machine record that is not destroyed, matched by the ``gpufleet-machine``
label or by provider + provider instance id:

- matched: not an orphan. A create still in flight (a PROVISIONING row with no provider
  id yet) is matched by its label, so it is never swept;
- unmatched: tracked in ``orphans`` from the first sweep that saw it, and destroyed only
  once it is older than the grace window counted from BOTH the provider's launch time and
  that first sighting — an old instance first seen now still waits the whole window;
- past its grace: a ledger row (``orphan_found``) and the intent (``DESTROYING``) are
  committed together, then the provisioner is called, then DESTROYED — or, when the call
  fails, a ledger row and the intent stays, so the next round tries again;
- an instance not labelled with our deployment is never touched (the provisioner never
  lists one; if a list ever did, it is refused here and logged as an error);
- a provider that could not be listed: no conclusion about its instances this round, and
  an incident after several rounds in a row (:mod:`listing_health`).

Leader-only: every write is fenced by the sweeper's lease.

What an operator reads (each counted once its transaction has committed):
``gpufleet.sweeper.orphans`` by provider and outcome — ``found`` when an orphan crosses its
grace window (its ``orphan_found`` ledger row), ``destroyed`` when its destroy succeeded,
``refused`` each round an orphan is left alone by a gate (inside its grace window, no
machine label to address it by, or another deployment's) — and the listing streaks'
gauge (:class:`~gpufleet.sweeper.listing_health.ListingStreaks`).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from opentelemetry import trace
from sqlalchemy import or_, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import Clock
from gpufleet.common.convert import enum_value
from gpufleet.common.db.enums import MachineState
from gpufleet.common.db.models import Machine, Orphan
from gpufleet.common.errors import GpufleetError
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.metrics.catalog import SWEEPER_LISTING_FAILURES, SWEEPER_ORPHANS
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.provider_errors import NotYetDone
from gpufleet.sweeper import listing_health, orphan_rows
from gpufleet.sweeper.listing import ListedInstance, Provisioner, provider_name
from gpufleet.sweeper.orphan_rows import OPEN_ACTIONS, InstanceKey, OrphanAction
from gpufleet.sweeper.sweeps import SweepResult
from gpufleet.v1 import machine_pb2

log = logging.getLogger(__name__)

NAME = "orphan_sweep"

# SWEEPER_ORPHANS outcomes.
FOUND = "found"
DESTROYED = "destroyed"
REFUSED = "refused"
# Gated this round: what an orphan's action says when the sweep leaves it alone.
_REFUSING = frozenset({OrphanAction.WAITING, OrphanAction.NEEDS_HUMAN})


@dataclass(frozen=True)
class OrphanPolicy:
    deployment_id: str
    grace: timedelta = timedelta(minutes=30)


@dataclass(frozen=True)
class Inventory:
    """Every machine record that is not destroyed: what counts as "recorded here"."""

    machine_ids: frozenset[str]
    instance_keys: frozenset[InstanceKey]

    def records(self, inst: ListedInstance) -> bool:
        return (inst.machine_label is not None and inst.machine_label in self.machine_ids) or (
            inst.provider,
            inst.provider_instance_id,
        ) in self.instance_keys


@dataclass(frozen=True)
class TrackedOrphan:
    """What an earlier sweep recorded about one instance."""

    first_seen_at: datetime
    action: str


@dataclass(frozen=True)
class OrphanView:
    """One listed instance with no record here, and what this round does about it."""

    instance: ListedInstance
    first_seen_at: datetime
    action: OrphanAction
    # It crossed its grace window this round (a ledger row is written now).
    newly_found: bool
    # No row yet: the first sweep that saw it.
    new: bool

    @property
    def key(self) -> InstanceKey:
        return self.instance.provider, self.instance.provider_instance_id


@dataclass
class OrphanDecision:
    orphans: list[OrphanView] = field(default_factory=list)
    # Tracked rows that stopped being orphans, and how: RECORDED, GONE or DESTROYED.
    settled: list[tuple[InstanceKey, OrphanAction]] = field(default_factory=list)
    # Listed but not labelled with our deployment: never touched.
    foreign: list[ListedInstance] = field(default_factory=list)


def past_grace(
    now: datetime, first_seen_at: datetime, launch_time: datetime | None, grace: timedelta
) -> bool:
    """Older than the grace window by both clocks (an unknown launch time counts as the
    first sighting, the later of the two possible answers)."""
    launched = launch_time if launch_time is not None else first_seen_at
    return now - first_seen_at >= grace and now - launched >= grace


def decide(
    now: datetime,
    instances: Iterable[ListedInstance],
    unreachable: Iterable[str],
    inventory: Inventory,
    tracked: Mapping[InstanceKey, TrackedOrphan],
    policy: OrphanPolicy,
) -> OrphanDecision:
    decision = OrphanDecision()
    listed: set[InstanceKey] = set()
    for inst in instances:
        if inst.deployment_label != policy.deployment_id:
            decision.foreign.append(inst)
            continue
        if inst.status == "TERMINATED":
            continue  # already gone: nothing bills
        key = (inst.provider, inst.provider_instance_id)
        listed.add(key)
        row = tracked.get(key)
        if inventory.records(inst):
            if row is not None and row.action != OrphanAction.RECORDED:
                decision.settled.append((key, OrphanAction.RECORDED))
            continue
        # The grace clock starts at the first sweep that saw it as an orphan: a row that
        # was matched to a record until now starts again.
        first_seen = now if row is None or row.action == OrphanAction.RECORDED else row.first_seen_at
        if not past_grace(now, first_seen, inst.launch_time, policy.grace):
            action = OrphanAction.WAITING
        elif inst.machine_label:
            action = OrphanAction.DESTROYING
        else:
            # The provisioner addresses an instance by its machine label: without one,
            # only a human can remove it.
            action = OrphanAction.NEEDS_HUMAN
        previous = row.action if row is not None else None
        newly_found = action is not OrphanAction.WAITING and previous != action
        decision.orphans.append(OrphanView(inst, first_seen, action, newly_found, row is None))
    down = set(unreachable)
    for key, row in tracked.items():
        if key in listed or key[0] in down:
            continue
        if row.action == OrphanAction.DESTROYING:
            decision.settled.append((key, OrphanAction.DESTROYED))
        elif row.action in (OrphanAction.WAITING, OrphanAction.NEEDS_HUMAN):
            decision.settled.append((key, OrphanAction.GONE))
    return decision


class OrphanSweep:
    """The thin apply around :func:`decide`; one round at a time per process."""

    name = NAME

    def __init__(
        self,
        sessions: sessionmaker[Session],
        provider: Provisioner,
        clock: Clock,
        policy: OrphanPolicy,
        *,
        rounds_before_incident: int = 3,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.provider = provider
        self.clock = clock
        self.policy = policy
        self.rounds_before_incident = rounds_before_incident
        self._lock = threading.Lock()
        self._orphans = instruments.counter(SWEEPER_ORPHANS)
        self.listing = listing_health.ListingStreaks()
        self._observing = instruments.observe(SWEEPER_LISTING_FAILURES, self.listing.observed)

    def close(self) -> None:
        """Stop reporting the listing gauge."""
        self._observing.close()

    def run(self, now: datetime, lease: LeaderLease) -> SweepResult:
        """One round: list, decide, record intent, destroy, record the outcome."""
        with self._lock:
            return self._run(now, lease)

    def _run(self, now: datetime, lease: LeaderLease) -> SweepResult:
        result = SweepResult(started_at=now)
        span = trace.get_current_span()
        try:
            listed, down = self.provider.list_all()
        except GpufleetError as err:
            with self.sessions() as session, session.begin():
                lease.fence(session)
                listing = listing_health.record_round(
                    session,
                    now,
                    [listing_health.PROVISIONER],
                    why=str(err),
                    rounds_before_incident=self.rounds_before_incident,
                    detector=NAME,
                )
            self.listing.committed(lease, listing.failed_rounds)
            result.summary = f"provisioner could not list instances: {err}; no action this round"
            result.report.refusals["PROVISIONER_UNREACHABLE"] += 1
            span.add_event("refused", {"gpufleet.net": NAME, "gpufleet.gate": "PROVISIONER_UNREACHABLE"})
            log.warning("%s: %s", NAME, result.summary)
            return result
        instances = [ListedInstance.from_proto(i) for i in listed]
        result.unreachable = [provider_name(p) for p in down]
        result.instances_seen = len(instances)
        inventory, tracked = self._load(instances)
        decision = decide(now, instances, result.unreachable, inventory, tracked, self.policy)
        for inst in decision.foreign:
            result.report.refusals["FOREIGN_INSTANCE"] += 1
            span.add_event("refused", {"gpufleet.net": NAME, "gpufleet.gate": "FOREIGN_INSTANCE"})
            log.error(
                "%s: the provisioner listed %s/%s labelled for deployment %r, not ours (%r); never touched",
                NAME,
                inst.provider,
                inst.provider_instance_id,
                inst.deployment_label,
                self.policy.deployment_id,
            )
        listed_providers = {i.provider for i in instances} - set(result.unreachable)
        to_destroy = self._record(now, decision, result.unreachable, listed_providers, lease)
        destroyed = sum(1 for view in to_destroy if self._destroy(view, lease))
        waiting = sum(1 for v in decision.orphans if v.action is OrphanAction.WAITING)
        result.orphans_seen = len(decision.orphans)
        result.orphans_destroyed = destroyed
        result.report.actions["orphan_waiting"] += waiting
        result.report.actions["orphan_destroyed"] += destroyed
        if result.unreachable:
            result.report.refusals["PROVIDER_UNREACHABLE"] += len(result.unreachable)
            span.add_event("refused", {"gpufleet.net": NAME, "gpufleet.gate": "PROVIDER_UNREACHABLE"})
        result.summary = (
            f"{result.instances_seen} instances listed, {result.orphans_seen} with no record here "
            f"({waiting} inside the grace window), {destroyed} destroyed"
            + (f", {len(to_destroy) - destroyed} destroy calls failed" if len(to_destroy) > destroyed else "")
            + (f"; {len(decision.foreign)} foreign instances refused" if decision.foreign else "")
            + (f"; unreachable: {', '.join(result.unreachable)}" if result.unreachable else "")
        )
        return result

    def _load(self, instances: list[ListedInstance]) -> tuple[Inventory, dict[InstanceKey, TrackedOrphan]]:
        """Every live machine record, and the orphan rows still in play or listed now."""
        ids = sorted({i.provider_instance_id for i in instances})
        with self.sessions() as session:
            machines = session.execute(
                select(Machine.id, Machine.provider, Machine.provider_instance_id).where(
                    Machine.state != MachineState.DESTROYED.value
                )
            ).all()
            rows = session.execute(
                select(Orphan).where(
                    or_(
                        Orphan.action.in_([a.value for a in OPEN_ACTIONS]),
                        Orphan.provider_instance_id.in_(ids),
                    )
                )
            ).scalars()
            tracked = {
                (r.provider, r.provider_instance_id): TrackedOrphan(r.first_seen_at, r.action) for r in rows
            }
        inventory = Inventory(
            machine_ids=frozenset(m[0] for m in machines),
            instance_keys=frozenset((m[1], m[2]) for m in machines if m[2]),
        )
        return inventory, tracked

    def _record(
        self,
        now: datetime,
        decision: OrphanDecision,
        unreachable: list[str],
        listed: set[str],
        lease: LeaderLease,
    ) -> list[OrphanView]:
        """One fenced transaction: what was seen, ledger rows, and the intent to destroy.
        Returns the orphans to destroy now (intent committed)."""
        to_destroy: list[OrphanView] = []
        # Another deployment's instances are refused whatever this round writes.
        counted: Counter[tuple[str, str]] = Counter((i.provider, REFUSED) for i in decision.foreign)
        with self.sessions() as session, session.begin():
            lease.fence(session)
            listing = listing_health.record_round(
                session,
                now,
                unreachable,
                why="named unreachable by the provisioner",
                rounds_before_incident=self.rounds_before_incident,
                detector=NAME,
            )
            for key, action in decision.settled:
                orphan_rows.settle(session, now, key, action)
            for view in decision.orphans:
                action = view.action
                if action is not OrphanAction.WAITING and orphan_rows.recorded_now(session, view.instance):
                    action = OrphanAction.RECORDED  # a record appeared since the scan
                orphan_rows.observe(session, now, view.instance, view.first_seen_at, action)
                if view.newly_found and action is not OrphanAction.RECORDED:
                    orphan_rows.found(session, now, view.instance, view.first_seen_at, detector=NAME)
                    counted[(view.instance.provider, FOUND)] += 1
                if action in _REFUSING:
                    counted[(view.instance.provider, REFUSED)] += 1
                if action is OrphanAction.DESTROYING:
                    to_destroy.append(view)
        self.listing.committed(lease, listing.failed_rounds, listed)
        for (provider, outcome), n in sorted(counted.items()):
            self._orphans.add(n, {"provider": provider, "outcome": outcome})
        return to_destroy

    def _destroy(self, view: OrphanView, lease: LeaderLease) -> bool:
        inst = view.instance
        offering = machine_pb2.Offering(
            provider=enum_value(machine_pb2.Provider, "PROVIDER_", inst.provider),
            region=inst.region,
            zone=inst.zone,
            instance_type=inst.instance_type,
            capacity_type=enum_value(
                machine_pb2.CapacityType, "CAPACITY_TYPE_", inst.capacity_type or "UNSPECIFIED"
            ),
        )
        try:
            existed = self.provider.destroy(
                inst.machine_label or "",
                offering,
                inst.provider_instance_id,
                request_id=f"orphan:{inst.provider}:{inst.provider_instance_id}:destroy",
            )
        except NotYetDone as err:
            # Accepted, not confirmed (EC2 shutting-down, a GCE delete still running): no
            # failure; the next sweep no longer lists it, or tries again.
            with self.sessions() as session, session.begin():
                lease.fence(session)
                record_failure(
                    session,
                    self.clock.now(),
                    FailureClass.DESTROY_UNCONFIRMED,
                    NAME,
                    machine_id=inst.machine_label,
                    details=(
                        f"destroying orphan {inst.provider}/{inst.provider_instance_id}: {err}; "
                        "its intent stays DESTROYING and the next sweep looks again"
                    ),
                )
            log.info("%s: destroy of orphan %s/%s not confirmed yet: %s", NAME, *view.key, err)
            return False
        except GpufleetError as err:
            with self.sessions() as session, session.begin():
                lease.fence(session)
                record_failure(
                    session,
                    self.clock.now(),
                    FailureClass.PROVIDER_CALL_FAILED,
                    NAME,
                    machine_id=inst.machine_label,
                    details=(
                        f"destroying orphan {inst.provider}/{inst.provider_instance_id} failed: {err}; "
                        "its intent stays DESTROYING and the next sweep tries again"
                    ),
                    incident_key=f"{NAME}:destroy:{inst.provider}:{inst.provider_instance_id}",
                )
            log.warning("%s: destroying orphan %s/%s failed: %s", NAME, *view.key, err)
            return False
        with self.sessions() as session, session.begin():
            lease.fence(session)
            orphan_rows.settle(session, self.clock.now(), view.key, OrphanAction.DESTROYED)
        self._orphans.add(1, {"provider": inst.provider, "outcome": DESTROYED})
        log.warning(
            "%s: destroyed orphan %s/%s (machine label %s)%s",
            NAME,
            inst.provider,
            inst.provider_instance_id,
            inst.machine_label,
            "" if existed else "; it was already gone",
            extra={"fields": {"provider": inst.provider, "provider_instance_id": inst.provider_instance_id}},
        )
        return True
