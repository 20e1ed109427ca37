"""The machine lifecycle: every allowed move of a machine's state, who may make it, and
the one compare-and-set writer every service uses.

Before this module the decisions about one machine's state were spread over ten write
sites in three services with no table. Now a move is ``transition(session, machine_id,
from_, to, by=..., why=...)``: it checks the move against :data:`TRANSITIONS` (a move the
table does not allow is a bug, raised as :class:`IllegalTransition`), and writes it as one
``UPDATE machines SET state = :to ... WHERE id = :id AND state IN (:from_)``, so two
writers racing on one machine cannot both win: the loser sees ``False`` and re-reads.
Every move records who made it and why (``state_changed_by``, ``state_reason``), shown by
``GetMachine`` and ``gpufleet machines``.

The states and their meaning are DESIGN §2's. ``REQUESTED`` is never written (a machine is
recorded straight into ``PROVISIONING``, intent first) and is not a state here;
``DRAINING`` is a ready machine that takes no new work while its jobs finish (films).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, update
from sqlalchemy.orm import Session

from gpufleet.common.db.enums import MachineState
from gpufleet.common.db.models import Machine
from gpufleet.common.errors import GpufleetError

S = MachineState


class Actor(StrEnum):
    """Who moves machines. A ledger net names itself in ``why``; the actor is its service."""

    FLEET_TICK = "fleet_tick"  # the scheduler's leader: scale and its provider calls
    WORKER = "worker"  # a machine's worker reporting in (WorkerService)
    REAPER = "reaper"  # the nets and the refusal ladder's stop/destroy
    SWEEPER = "sweeper"  # the provider's own list: pre-emptions, vanished instances
    OPERATOR = "operator"  # a person, through FleetService or ReaperService


A = Actor

# (from, to) -> who may make the move.
TRANSITIONS: dict[tuple[MachineState, MachineState], frozenset[Actor]] = {
    # Create: the fleet tick's call answered; the stuck-transition net read the provider.
    (S.PROVISIONING, S.BOOTING): frozenset({A.FLEET_TICK, A.REAPER}),
    # The provider refused outright (nothing exists), or the net found nothing there.
    (S.PROVISIONING, S.DESTROYED): frozenset({A.FLEET_TICK, A.REAPER, A.SWEEPER}),
    (S.PROVISIONING, S.DESTROYING): frozenset({A.REAPER}),
    # The worker reports: the machine is up.
    (S.BOOTING, S.READY): frozenset({A.WORKER}),
    (S.BOOTING, S.STOPPING): frozenset({A.REAPER}),
    (S.BOOTING, S.DESTROYING): frozenset({A.REAPER}),
    (S.BOOTING, S.STOPPED): frozenset({A.SWEEPER}),
    (S.BOOTING, S.DESTROYED): frozenset({A.SWEEPER}),
    (S.READY, S.DRAINING): frozenset({A.FLEET_TICK, A.OPERATOR}),
    (S.READY, S.STOPPING): frozenset({A.REAPER}),
    (S.READY, S.DESTROYING): frozenset({A.REAPER}),
    (S.READY, S.STOPPED): frozenset({A.SWEEPER}),
    # An operator deregisters a self-registered box (nothing at a provider is touched).
    (S.READY, S.DESTROYED): frozenset({A.SWEEPER, A.OPERATOR}),
    (S.DRAINING, S.READY): frozenset({A.FLEET_TICK, A.OPERATOR}),
    (S.DRAINING, S.STOPPING): frozenset({A.REAPER}),
    (S.DRAINING, S.DESTROYING): frozenset({A.REAPER}),
    (S.DRAINING, S.STOPPED): frozenset({A.SWEEPER}),
    (S.DRAINING, S.DESTROYED): frozenset({A.SWEEPER, A.OPERATOR}),
    # The refusal ladder's provider calls, and what the stuck net reads afterwards.
    (S.STOPPING, S.STOPPED): frozenset({A.REAPER, A.SWEEPER}),
    (S.STOPPING, S.DESTROYING): frozenset({A.REAPER}),
    (S.STOPPING, S.DESTROYED): frozenset({A.REAPER, A.SWEEPER}),
    (S.STOPPED, S.STARTING): frozenset({A.FLEET_TICK}),
    # The provider started a stopped spot instance by itself (EC2 restarts an interrupted
    # persistent request when capacity returns): the machine follows it, for the nets.
    (S.STOPPED, S.BOOTING): frozenset({A.SWEEPER}),
    (S.STOPPED, S.DESTROYING): frozenset({A.REAPER}),
    (S.STOPPED, S.DESTROYED): frozenset({A.SWEEPER}),
    (S.STARTING, S.BOOTING): frozenset({A.FLEET_TICK, A.REAPER}),
    # The provider refused the start outright: still stopped.
    (S.STARTING, S.STOPPED): frozenset({A.FLEET_TICK, A.REAPER, A.SWEEPER}),
    (S.STARTING, S.DESTROYING): frozenset({A.REAPER}),
    (S.STARTING, S.DESTROYED): frozenset({A.REAPER, A.SWEEPER}),
    (S.DESTROYING, S.DESTROYED): frozenset({A.REAPER, A.SWEEPER}),
}

# A destroyed machine is never moved again: every scan skips it.
FINAL = frozenset({S.DESTROYED})

# The states in which a cloud bills a machine's compute (its GPUs): from the create request
# until it is destroyed, except while it is STOPPED — a stopped instance keeps only its disk
# (DESIGN §2: a stop keeps the disk; the gcp driver: "no compute billed"). The transitional
# states bill: a create or start may already have begun the meter, and a stop or destroy in
# flight has not ended it yet. The one owner of the notion: the fleet tick's ceiling counts
# these machines (they cost money whatever their health), and its GPU-seconds billed and
# spend rate are measured over them.
BILLING_STATES = frozenset(set(S) - {S.STOPPED, S.DESTROYED})


def not_yet_listed(
    requested_at: datetime | None, provider_seen_at: datetime | None, now: datetime, grace: timedelta
) -> bool:
    """Whether a machine missing from its provider's list is merely *not yet listed*: it has
    never been listed (``provider_seen_at`` is unset) and its create was requested less
    than ``grace`` ago. A provider's list lags its creates (EC2's DescribeInstances is
    eventually consistent; a list read while a create is in flight cannot show it), and a
    record dropped on that absence leaks the instance that then appears (SkyPilot #4431),
    while re-creating on it buys a second one.

    A named condition, not a lifecycle state: the machine's state stays what it is doing
    (BOOTING, READY) so every other net keeps its own gate and deadline on it (the boot
    failure and provision deadlines still run from ``requested_at``); it is derived afresh
    from two recorded columns on every pass, so it can never be left behind by a crash; and
    it ends by itself — the next list that shows the instance writes ``provider_seen_at``,
    and after the grace the ordinary loss path (a fresh read, then instance gone) applies.
    """
    if provider_seen_at is not None or requested_at is None:
        return False
    return now - requested_at < grace


class IllegalTransition(GpufleetError):
    """A move the lifecycle table does not allow: a bug in the caller, never input."""


def allowed(from_: MachineState, to: MachineState, by: Actor) -> bool:
    return by in TRANSITIONS.get((from_, to), frozenset())


def check(from_: Iterable[MachineState], to: MachineState, by: Actor) -> tuple[MachineState, ...]:
    """The ``from_`` states, each checked against the table (raises when one is not)."""
    states = tuple(from_)
    for state in states:
        if not allowed(state, to, by):
            raise IllegalTransition(f"{by.value} may not move a machine from {state.value} to {to.value}")
    return states


def transition(
    session: Session,
    machine_id: str,
    from_: MachineState | Iterable[MachineState],
    to: MachineState,
    *,
    by: Actor,
    why: str,
    now: datetime,
    where: Iterable[ColumnElement[bool]] = (),
    **values: Any,
) -> bool:
    """Move ``machine_id`` from one of ``from_`` to ``to``, with ``values`` written in the
    same statement; False when the machine was not in ``from_`` (someone else moved it).

    ``where`` adds the caller's own conditions to the compare-and-set (still ours, still
    due, unchanged since the scan): False too when one of them no longer holds.
    """
    states = check((from_,) if isinstance(from_, MachineState) else from_, to, by)
    result = session.execute(
        update(Machine)
        .where(Machine.id == machine_id, Machine.state.in_([s.value for s in states]), *where)
        .values(
            state=to.value,
            state_changed_at=now,
            state_changed_by=by.value,
            state_reason=why[:500],
            **values,
        )
        .execution_options(synchronize_session="fetch")
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def record(machine: Machine, to: MachineState, *, by: Actor, why: str, now: datetime) -> None:
    """Move a machine row already loaded (and locked) in this transaction; for writers
    that hold the row anyway. The same table check as :func:`transition`."""
    check((MachineState(machine.state),), to, by)
    machine.state = to.value
    machine.state_changed_at = now
    machine.state_changed_by = by.value
    machine.state_reason = why[:500]
