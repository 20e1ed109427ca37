"""A loss's first sign, which its detection latency is measured from: the last listing that
showed the instance running, or — never listed running — when it entered its running
state here."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.sweeper.inventory_reconcile import ReconcileMachine, decide
from gpufleet.sweeper.listing import ListedInstance

LISTED_AT = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
ENTERED = LISTED_AT - timedelta(hours=1)
SEEN = LISTED_AT - timedelta(seconds=60)

SPOT = ReconcileMachine(
    machine_id="m1",
    provider="SIM",
    provider_instance_id="i-1",
    origin="PROVISIONED",
    managed=True,
    state="READY",
    intent="RUNNING",
    capacity_type="SPOT",
    state_changed_at=ENTERED,
)
TERMINATED = ListedInstance(
    provider="SIM", provider_instance_id="i-1", machine_label="m1", status="TERMINATED"
)


@pytest.mark.parametrize(
    ("case", "machine", "listed", "expected"),
    [
        (
            "terminated, last listed running a minute ago",
            replace(SPOT, provider_seen_at=SEEN),
            [TERMINATED],
            SEEN,
        ),
        (
            "gone from the list, last listed running a minute ago",
            replace(SPOT, provider_seen_at=SEEN),
            [],
            SEEN,
        ),
        ("never listed running: since it entered its state", SPOT, [TERMINATED], ENTERED),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_first_sign(
    case: str, machine: ReconcileMachine, listed: list[ListedInstance], expected: datetime
) -> None:
    [loss] = decide(LISTED_AT, [machine], listed, []).losses
    assert loss.last_known_running == expected
