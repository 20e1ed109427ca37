"""The ``orphans`` table: what the orphan sweep saw at the providers and did about it,
and how ListOrphans shows it. Every function here runs inside the caller's transaction."""

from __future__ import annotations

import logging
from datetime import datetime
from enum import StrEnum

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from gpufleet.common.convert import enum_value, ts
from gpufleet.common.db.enums import MachineState
from gpufleet.common.db.models import Machine, Orphan
from gpufleet.common.ledger import FailureClass, open_incident, record_failure
from gpufleet.sweeper.listing import ListedInstance
from gpufleet.v1 import machine_pb2, sweeper_service_pb2

log = logging.getLogger(__name__)

InstanceKey = tuple[str, str]


class OrphanAction(StrEnum):
    # Inside its grace window.
    WAITING = "WAITING"
    # Past it: intent recorded, the destroy call made or about to be (retried each round).
    DESTROYING = "DESTROYING"
    DESTROYED = "DESTROYED"
    # It went away by itself.
    GONE = "GONE"
    # A machine record matches it after all: not an orphan.
    RECORDED = "RECORDED"
    # Past its grace but without a machine label: the provisioner cannot address it.
    NEEDS_HUMAN = "NEEDS_HUMAN"


# Rows still in play: loaded every round whether or not their instance is listed.
OPEN_ACTIONS = frozenset({OrphanAction.WAITING, OrphanAction.DESTROYING, OrphanAction.NEEDS_HUMAN})


def row(session: Session, key: InstanceKey) -> Orphan | None:
    return session.execute(
        select(Orphan)
        .where(Orphan.provider == key[0], Orphan.provider_instance_id == key[1])
        .with_for_update()
    ).scalar_one_or_none()


def recorded_now(session: Session, inst: ListedInstance) -> bool:
    """Re-read in the intent's own transaction: does a live machine record match it now?"""
    same_instance = (Machine.provider == inst.provider) & (
        Machine.provider_instance_id == inst.provider_instance_id
    )
    matches = or_(Machine.id == inst.machine_label, same_instance) if inst.machine_label else same_instance
    found = session.execute(
        select(Machine.id).where(Machine.state != MachineState.DESTROYED.value, matches).limit(1)
    ).first()
    return found is not None


def observe(
    session: Session, now: datetime, inst: ListedInstance, first_seen_at: datetime, action: OrphanAction
) -> Orphan:
    """Insert or update the row of a listed orphan with this round's sighting."""
    orphan = row(session, (inst.provider, inst.provider_instance_id))
    if orphan is None:
        orphan = Orphan(
            provider=inst.provider,
            provider_instance_id=inst.provider_instance_id,
            action=action.value,
            action_at=now,
        )
        session.add(orphan)
    if orphan.action != action.value:
        orphan.action = action.value
        orphan.action_at = now
    if action is not OrphanAction.DESTROYED:
        orphan.destroyed_at = None
    orphan.first_seen_at = first_seen_at
    orphan.last_seen_at = now
    orphan.machine_label = inst.machine_label
    orphan.region, orphan.zone, orphan.instance_type = inst.region, inst.zone, inst.instance_type
    orphan.capacity_type = inst.capacity_type or "ON_DEMAND"
    orphan.status = inst.status
    orphan.launch_time = inst.launch_time
    session.flush()
    return orphan


def settle(session: Session, now: datetime, key: InstanceKey, action: OrphanAction) -> None:
    """A tracked row stopped being an orphan (RECORDED, GONE) or was destroyed."""
    orphan = row(session, key)
    if orphan is None:
        return
    if orphan.action != action.value:
        orphan.action = action.value
        orphan.action_at = now
    if action is OrphanAction.DESTROYED and orphan.destroyed_at is None:
        orphan.destroyed_at = now


def found(
    session: Session, now: datetime, inst: ListedInstance, first_seen_at: datetime, *, detector: str
) -> None:
    """The ledger row of an orphan past its grace window — and an incident when it has no
    machine label, because then only a human can remove it."""
    launched = inst.launch_time.isoformat() if inst.launch_time else "unknown"
    details = (
        f"instance {inst.provider}/{inst.provider_instance_id} ({inst.status}, machine label "
        f"{inst.machine_label or 'none'}) exists at the provider with nothing recorded here; launched "
        f"{launched}, first seen {first_seen_at.isoformat()}"
    )
    if inst.machine_label:
        details += "; destroying it"
    else:
        details += "; it carries no machine label, so the provisioner cannot address it: remove it by hand"
    record_failure(
        session, now, FailureClass.ORPHAN_FOUND, detector, machine_id=inst.machine_label, details=details
    )
    if not inst.machine_label:
        open_incident(
            session,
            now,
            FailureClass.ORPHAN_FOUND,
            details,
            dedupe_key=f"{detector}:needs_human:{inst.provider}:{inst.provider_instance_id}",
        )
    log.warning("%s: orphan found: %s", detector, details)


def to_proto(orphan: Orphan) -> sweeper_service_pb2.Orphan:
    return sweeper_service_pb2.Orphan(
        name=f"orphans/{orphan.provider.lower()}/{orphan.provider_instance_id}",
        provider=enum_value(machine_pb2.Provider, "PROVIDER_", orphan.provider),
        provider_instance_id=orphan.provider_instance_id,
        machine_label=orphan.machine_label or "",
        launch_time=ts(orphan.launch_time),
        first_seen_time=ts(orphan.first_seen_at),
        destroy_time=ts(orphan.destroyed_at),
        action=orphan.action,
    )
