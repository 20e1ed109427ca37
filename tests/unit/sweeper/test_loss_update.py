"""What a loss writes on its machine (machine_loss.loss_update), decided once for the
sweeper's writer and the simulator: the machine follows the provider with the matching
intent, a pre-emption counts one and adds the run it cut short, and a stopped machine keeps
its destroy timer for the money chain."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.common.db.enums import CapacityType, MachineIntent, MachineState
from gpufleet.sweeper.machine_loss import MachineLoss, classify_loss, loss_update

NOW = datetime(2026, 12, 5, 12, tzinfo=UTC)
SEEN = NOW - timedelta(minutes=50)


def _loss(capacity: str, status: str, *, itself: bool = False) -> MachineLoss:
    classified = classify_loss(capacity, status, itself)
    assert classified is not None
    kind, end = classified
    return MachineLoss("m1", kind, end, status, "READY", SEEN)


@pytest.mark.parametrize(
    ("capacity", "status", "end", "intent", "preempted", "clears"),
    [
        (CapacityType.SPOT, "TERMINATED", MachineState.DESTROYED, MachineIntent.DESTROYED, 1, 2),
        (CapacityType.SPOT, "STOPPED", MachineState.STOPPED, MachineIntent.STOPPED, 1, 1),
        (CapacityType.ON_DEMAND, "", MachineState.DESTROYED, MachineIntent.DESTROYED, 0, 2),
        (CapacityType.ON_DEMAND, "STOPPED", MachineState.STOPPED, MachineIntent.STOPPED, 0, 1),
    ],
    ids=["preempted", "spot-stopped", "vanished", "stopped-outside"],
)
def test_the_machine_follows_the_provider(
    capacity: str, status: str, end: MachineState, intent: MachineIntent, preempted: int, clears: int
) -> None:
    update = loss_update(_loss(capacity, status), SEEN, NOW)
    assert (update.end_state, update.intent, update.preemptions_added) == (end, intent, preempted)
    assert update.spot_seconds_added == (3000.0 if preempted else 0.0)
    assert update.clears == ("stop_due_at", "destroy_due_at")[:clears]


def test_a_machine_that_stopped_itself_is_no_preemption_even_on_spot() -> None:
    update = loss_update(_loss(CapacityType.SPOT, "STOPPED", itself=True), SEEN, NOW)
    assert (update.preemptions_added, update.spot_seconds_added) == (0, 0.0)
    assert update.clears == ("stop_due_at",)


def test_a_machine_never_observed_running_adds_no_spot_time() -> None:
    assert loss_update(_loss(CapacityType.SPOT, "TERMINATED"), None, NOW).spot_seconds_added == 0.0
