"""A machine the provider took back while we wanted it running (DESIGN §2, §6, §7).

:func:`classify_loss` is pure: what the provider's word about one instance means for a
machine whose intent is RUNNING. :func:`apply_loss` writes one conclusion in one fenced
transaction:

- a ledger row: ``spot_stopped`` for a spot instance the cloud *stopped* (GCE's
  instanceTerminationAction=STOP, EC2's interruption behaviour "stop": instance and disk
  kept), ``preempted`` for a spot instance taken back for good, ``instance_gone``
  otherwise; all route to ``REPLACE_MACHINE``, and the ledger applies it in the same transaction
  (:func:`gpufleet.common.ledger.record_and_apply`): the live attempts end ``LOST``,
  uncharged, and their jobs go back to the queue on the patient budget, exactly as when a
  reaper net replaces a machine;
- a pre-emption grows the machine's history — ``preemption_count`` and the spot time it
  ran (``spot_seconds``, from when this platform last saw it start) — which the scale
  step reads as its expected cost;
- the machine follows the provider: STOPPED (disk kept) or DESTROYED, with the matching
  intent, so the next reconcile does not count the same loss again and nothing routes to
  it. The destroy timer of a stopped machine is kept for the money chain.

Why a spot machine the cloud stopped is *kept stopped* rather than restarted at once or
destroyed (DESIGN §7, "Scale"): a stopped machine is warm capacity — its disk holds the
image and the pipeline versions it pulled — and the scale step starts the stopped machine
with the lowest expected cost an hour before it creates one, where that cost now carries
this pre-emption (``preemption_count``, ``spot_seconds``). Restarting here would spend
money on a machine no demand asked for, and on the capacity the cloud just reclaimed (GCE
refuses the start while the zone has none; EC2 refuses StartInstances on an interrupted
persistent request and restarts it itself when capacity returns); destroying it would
throw the warm disk away. Its work, meanwhile, is replaced at once (the attempts end
``LOST`` and their jobs go back to the queue), so nothing waits on its return.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import spot_history
from gpufleet.common.attempts import LostAttempt
from gpufleet.common.db.enums import CapacityType, MachineIntent, MachineOrigin, MachineState
from gpufleet.common.db.models import Machine
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, OutcomePolicy, record_and_apply
from gpufleet.common.lifecycle import Actor, record

log = logging.getLogger(__name__)


class LossKind(StrEnum):
    # A spot instance taken back by the provider for good (terminated or gone).
    PREEMPTED = "PREEMPTED"
    # A spot instance the provider stopped (instance and disk kept): warm capacity again.
    SPOT_STOPPED = "SPOT_STOPPED"
    # An on-demand instance that no longer exists.
    VANISHED = "VANISHED"
    # An on-demand instance stopped by someone other than this platform.
    STOPPED_OUTSIDE = "STOPPED_OUTSIDE"
    # The machine halted itself (its agent's dead-man switch), spot or on demand.
    STOPPED_ITSELF = "STOPPED_ITSELF"


@dataclass(frozen=True)
class MachineLoss:
    """One machine to end as lost, and what the scan read about it (re-checked at write)."""

    machine_id: str
    kind: LossKind
    end_state: MachineState
    # The provider's word: STOPPED, TERMINATED, or "" (not listed at all).
    provider_status: str
    state: str
    state_changed_at: datetime | None
    # The loss's first sign, for the detection latency: the last listing that showed the
    # instance running (``provider_seen_at``) — it was lost some time after — or, for one
    # never listed running, when it entered its running state here.
    last_known_running: datetime | None = None

    @property
    def failure_class(self) -> FailureClass:
        return {
            LossKind.STOPPED_ITSELF: FailureClass.MACHINE_STOPPED_ITSELF,
            LossKind.SPOT_STOPPED: FailureClass.SPOT_STOPPED,
            LossKind.PREEMPTED: FailureClass.PREEMPTED,
        }.get(self.kind, FailureClass.INSTANCE_GONE)

    @property
    def preemption(self) -> bool:
        """Counted in the machine's pre-emption history (its expected cost)."""
        return self.kind in (LossKind.PREEMPTED, LossKind.SPOT_STOPPED)


def classify_loss(
    capacity_type: str, provider_status: str, stopped_by_itself: bool = False
) -> tuple[LossKind, MachineState] | None:
    """What the provider's status (``""``: not listed) means for an intent-RUNNING machine,
    or None when it is not a loss (running) or not settled yet (pending, stopping). A stop
    the provider says the machine made itself is its dead-man switch, never a pre-emption."""
    spot = capacity_type == CapacityType.SPOT
    if provider_status == "STOPPED" and stopped_by_itself:
        return LossKind.STOPPED_ITSELF, MachineState.STOPPED
    if provider_status == "STOPPED":
        return (LossKind.SPOT_STOPPED if spot else LossKind.STOPPED_OUTSIDE), MachineState.STOPPED
    if provider_status in ("TERMINATED", ""):
        return (LossKind.PREEMPTED if spot else LossKind.VANISHED), MachineState.DESTROYED
    return None


@dataclass(frozen=True)
class LossUpdate:
    """What a loss writes on its machine beside its ledger row, decided once: the sweeper's
    writer (:func:`apply_loss`) and the simulator apply it."""

    end_state: MachineState
    intent: MachineIntent
    # The pre-emption history the scale step prices (gpufleet.common.spot_history).
    preemptions_added: int
    spot_seconds_added: float
    # The idle timers set to nothing: a stopped machine keeps its destroy timer for the
    # money chain.
    clears: tuple[str, ...]


def loss_update(loss: MachineLoss, first_observed_at: datetime | None, now: datetime) -> LossUpdate:
    """The machine follows the provider (STOPPED, disk kept, or DESTROYED, with the matching
    intent); a pre-emption counts one and adds the run it cut short."""
    stopped = loss.end_state is MachineState.STOPPED
    return LossUpdate(
        end_state=loss.end_state,
        intent=MachineIntent.STOPPED if stopped else MachineIntent.DESTROYED,
        preemptions_added=1 if loss.preemption else 0,
        spot_seconds_added=spot_history.ran_s(first_observed_at, now) if loss.preemption else 0.0,
        clears=("stop_due_at",) if stopped else ("stop_due_at", "destroy_due_at"),
    )


def _still_applies(m: Machine, loss: MachineLoss) -> bool:
    """The scan's view still holds: nothing (a deliberate stop, a start) moved it since."""
    return (
        m.intent == MachineIntent.RUNNING
        and m.managed
        and m.origin == MachineOrigin.PROVISIONED
        and m.state == loss.state
        and m.state_changed_at == loss.state_changed_at
    )


def _why(loss: MachineLoss) -> str:
    seen = f"listed as {loss.provider_status}" if loss.provider_status else "no longer listed"
    return {
        LossKind.PREEMPTED: f"spot instance pre-empted by the provider ({seen})",
        LossKind.SPOT_STOPPED: (
            f"spot instance stopped by the provider's pre-emption ({seen}); instance and disk kept: "
            "the machine stays stopped as warm capacity, restarted by the scale step when it is "
            "the cheapest way to meet demand, else destroyed by auto-destroy once stopped for the "
            "money chain's stop-to-destroy gap"
        ),
        LossKind.VANISHED: f"instance vanished at the provider ({seen})",
        LossKind.STOPPED_OUTSIDE: f"instance stopped outside the platform ({seen})",
        LossKind.STOPPED_ITSELF: (
            f"the machine stopped itself ({seen}): its agent heard from no control plane for its "
            "dead-man limit while idle"
        ),
    }[loss.kind]


def apply_loss(
    sessions: sessionmaker[Session],
    lease: LeaderLease,
    now: datetime,
    loss: MachineLoss,
    *,
    detector: str,
    outcomes: OutcomePolicy,
) -> list[LostAttempt] | None:
    """Write one loss (see the module docstring); None when the machine changed since the
    scan and nothing was written."""
    with sessions() as session, session.begin():
        lease.fence(session)
        machine = session.execute(
            select(Machine).where(Machine.id == loss.machine_id).with_for_update()
        ).scalar_one_or_none()
        if machine is None or not _still_applies(machine, loss):
            return None
        why = _why(loss)
        update = loss_update(loss, machine.first_observed_at, now)
        machine.preemption_count += update.preemptions_added
        machine.spot_seconds += update.spot_seconds_added
        _, applied = record_and_apply(
            session,
            now,
            loss.failure_class,
            detector,
            machine_id=machine.id,
            details=(
                f"{why}; instance {machine.provider_instance_id or '?'} at {machine.provider}; "
                f"machine {loss.state} -> {loss.end_state.value}"
                + (
                    f"; pre-emption {machine.preemption_count}, ran {update.spot_seconds_added:.0f}s of spot "
                    "time this run"
                    if loss.preemption
                    else ""
                )
            ),
            policy=outcomes,
        )
        lost = applied.lost_attempts
        record(machine, update.end_state, by=Actor.SWEEPER, why=f"{detector}: {why}", now=now)
        machine.intent = update.intent.value
        for timer in update.clears:
            setattr(machine, timer, None)
    log.warning(
        "machine %s lost: %s; attempts ended lost, uncharged: %s",
        loss.machine_id,
        why,
        ", ".join(f"{a.attempt_id} (job {a.job_id} -> {a.job_state})" for a in lost) or "none",
        extra={"fields": {"machine_id": loss.machine_id, "kind": loss.kind.value, "attempts": len(lost)}},
    )
    return lost
