"""A spot machine recorded stopped that its provider runs again by itself.

EC2 restarts a persistent spot instance with interruption behaviour ``stop`` on its own
once capacity returns (and refuses StartInstances on it until then). The inventory
reconcile recorded the interruption as ``spot_stopped`` and left the machine STOPPED, its
intent STOPPED — so without this the restarted instance would bill with nothing routed to
it and no net looking at it: the reconcile acts only on intent RUNNING, and the money
chain never arms a machine it believes stopped.

The machine follows the provider instead: it becomes BOOTING with intent RUNNING, as a
start by the scale step leaves it (a new life: boot window from now, no idle timers, no
lost mark), with one ``spot_restarted`` ledger row (routed NOTHING). From there the
ordinary nets govern it: its worker reports and it takes work, or it sits idle and the
money chain stops it again; a worker that never reports is the boot-failure net's.

Only a SPOT machine of ours, STOPPED with intent STOPPED, listed RUNNING by a list read
after it last moved (a stop of ours that finished after the list is not judged by it).
A machine the scale step is starting is STARTING (intent recorded first), never here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db.enums import CapacityType, MachineIntent, MachineOrigin, MachineState
from gpufleet.common.db.models import Machine
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure
from gpufleet.common.lifecycle import Actor, record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restarted:
    """One machine whose spot instance the provider runs again (re-checked at write)."""

    machine_id: str
    state_changed_at: datetime
    provider_instance_id: str
    agent_address: str = ""


def restarted_by_provider(
    *,
    state: str,
    intent: str,
    capacity_type: str,
    managed: bool,
    origin: str,
    state_changed_at: datetime | None,
    listed_status: str,
    listed_at: datetime,
) -> bool:
    return (
        state == MachineState.STOPPED
        and intent == MachineIntent.STOPPED
        and capacity_type == CapacityType.SPOT
        and managed
        and origin == MachineOrigin.PROVISIONED
        and listed_status == "RUNNING"
        and state_changed_at is not None
        and state_changed_at <= listed_at
    )


def apply_restart(
    sessions: sessionmaker[Session], lease: LeaderLease, now: datetime, restarted: Restarted, *, detector: str
) -> bool:
    """Follow the provider (module docstring); False when the machine moved since the scan."""
    with sessions() as session, session.begin():
        lease.fence(session)
        machine = session.execute(
            select(Machine).where(Machine.id == restarted.machine_id).with_for_update()
        ).scalar_one_or_none()
        if machine is None or not (
            machine.state == MachineState.STOPPED
            and machine.intent == MachineIntent.STOPPED
            and machine.managed
            and machine.origin == MachineOrigin.PROVISIONED
            and machine.state_changed_at == restarted.state_changed_at
        ):
            return False
        why = (
            f"the provider runs spot instance {restarted.provider_instance_id} again by itself "
            "(an interrupted persistent request restarted when capacity returned): the machine "
            "follows it, BOOTING, for the nets and the money chain"
        )
        record_failure(
            session, now, FailureClass.SPOT_RESTARTED.value, detector, machine_id=machine.id, details=why
        )
        record(machine, MachineState.BOOTING, by=Actor.SWEEPER, why=f"{detector}: {why}", now=now)
        machine.intent = MachineIntent.RUNNING.value
        machine.first_observed_at = now
        machine.provider_seen_at = now
        if restarted.agent_address:
            machine.agent_address = restarted.agent_address
        # A new life, as a start leaves it.
        machine.stop_due_at = None
        machine.destroy_due_at = None
        machine.start_failures = 0
        machine.backoff_until = None
        machine.lost = False
        machine.probe_failed_since = None
        machine.startup_failed_at = None
    log.warning(
        "machine %s: %s",
        restarted.machine_id,
        why,
        extra={"fields": {"machine_id": restarted.machine_id}},
    )
    return True
