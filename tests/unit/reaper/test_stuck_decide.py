"""Stuck transition's decision, from a table: finish when the provider agrees with the
recorded intent, alert otherwise, never retry."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from gpufleet.common.db.enums import MachineState
from gpufleet.reaper.refusal import MachineSnapshot, RefusalReason, Refuse
from gpufleet.reaper.stuck_transition import (
    GONE,
    AlertStuck,
    FinishTransition,
    ProviderView,
    StuckPolicy,
    decide,
)
from tests.unit.reaper.nets_fixtures import HEALTHY, NOW, ago

POLICY = StuckPolicy(stuck_after=timedelta(minutes=10))


def stuck(state: str, intent: str, minutes: float = 10) -> MachineSnapshot:
    return replace(HEALTHY, state=state, intent=intent, state_changed_at=ago(minutes=minutes))


ALERT = "alert"
CASES: list[tuple[str, MachineSnapshot, ProviderView, object]] = [
    (
        "stop happened",
        stuck("STOPPING", "STOPPED"),
        ProviderView("STOPPED"),
        FinishTransition(MachineState.STOPPED),
    ),
    ("stop never happened", stuck("STOPPING", "STOPPED"), ProviderView("RUNNING"), ALERT),
    ("stop still in progress after 10 min", stuck("STOPPING", "STOPPED"), ProviderView("STOPPING"), ALERT),
    ("stopping an instance that vanished", stuck("STOPPING", "STOPPED"), ProviderView(GONE), ALERT),
    (
        "destroy happened",
        stuck("DESTROYING", "DESTROYED"),
        ProviderView(GONE),
        FinishTransition(MachineState.DESTROYED),
    ),
    (
        "destroy: terminated",
        stuck("DESTROYING", "DESTROYED"),
        ProviderView("TERMINATED"),
        FinishTransition(MachineState.DESTROYED),
    ),
    ("destroy never happened", stuck("DESTROYING", "DESTROYED"), ProviderView("RUNNING"), ALERT),
    (
        "destroy of a stopped instance never happened",
        stuck("DESTROYING", "DESTROYED"),
        ProviderView("STOPPED"),
        ALERT,
    ),
    (
        "start happened",
        stuck("STARTING", "RUNNING"),
        ProviderView("RUNNING", "i-1", "10.0.0.1:50060"),
        FinishTransition(MachineState.BOOTING, "i-1", "10.0.0.1:50060"),
    ),
    (
        "start under way",
        stuck("STARTING", "RUNNING"),
        ProviderView("PENDING"),
        FinishTransition(MachineState.BOOTING),
    ),
    ("start never happened", stuck("STARTING", "RUNNING"), ProviderView("STOPPED"), ALERT),
    (
        "create answered late",
        stuck("PROVISIONING", "RUNNING"),
        ProviderView("RUNNING", "i-2"),
        FinishTransition(MachineState.BOOTING, "i-2"),
    ),
    ("create never happened", stuck("PROVISIONING", "RUNNING"), ProviderView(GONE), ALERT),
    (
        "intent wins over the state's name",
        stuck("STOPPING", "DESTROYED"),
        ProviderView(GONE),
        FinishTransition(MachineState.DESTROYED),
    ),
    ("an intent nobody knows", stuck("STOPPING", "PAUSED"), ProviderView("STOPPED"), ALERT),
    # The lifecycle has no STOPPING -> BOOTING nor DESTROYING -> STOPPED: a human looks.
    ("stopping, yet meant to run", stuck("STOPPING", "RUNNING"), ProviderView("RUNNING"), ALERT),
    ("destroying, yet meant to be stopped", stuck("DESTROYING", "STOPPED"), ProviderView("STOPPED"), ALERT),
    ("not long enough", stuck("STOPPING", "STOPPED", minutes=9.9), ProviderView("STOPPED"), None),
    ("not transitional", replace(HEALTHY, state_changed_at=ago(hours=5)), ProviderView("RUNNING"), None),
    (
        "provider unreadable",
        stuck("STOPPING", "STOPPED"),
        ProviderView(error="TRANSIENT: throttled"),
        Refuse(RefusalReason.PROVIDER_UNREADABLE),
    ),
    (
        "registered",
        replace(stuck("STOPPING", "STOPPED"), origin="REGISTERED"),
        ProviderView("STOPPED"),
        Refuse(RefusalReason.NOT_OURS),
    ),
]


@pytest.mark.parametrize(("machine", "view", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_decide(machine: MachineSnapshot, view: ProviderView, expected: object) -> None:
    decision = decide(NOW, machine, view, POLICY)
    if expected == ALERT:
        assert isinstance(decision, AlertStuck)
    else:
        assert decision == expected


def test_the_net_holds_no_call_but_a_read() -> None:
    from gpufleet.reaper.stuck_transition import InstanceReader

    methods = {m for m in vars(InstanceReader) if not m.startswith("_")}
    assert methods == {"get"}
