"""Stuck transition's decision, from a table: finish when the provider agrees with the
recorded intent; re-issue a stop or destroy the provider has not carried out, a bounded
number of times, walking the ladder; alert otherwise — and never re-issue a create or a
start."""

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
    ReissueCall,
    StuckPolicy,
    decide,
    due_at,
    finish_values,
    gate,
    opens_incident,
    this_transition,
)
from tests.unit.reaper.nets_fixtures import HEALTHY, NOW, ago

POLICY = StuckPolicy(stuck_after=timedelta(minutes=10))


def stuck(state: str, intent: str, minutes: float = 10) -> MachineSnapshot:
    return replace(HEALTHY, state=state, intent=intent, state_changed_at=ago(minutes=minutes))


ALERT = "alert"
STOP = "stop"
DESTROY = "destroy"
CASES: list[tuple[str, MachineSnapshot, ProviderView, object]] = [
    (
        "stop happened",
        stuck("STOPPING", "STOPPED"),
        ProviderView("STOPPED"),
        FinishTransition(MachineState.STOPPED),
    ),
    ("stop never happened", stuck("STOPPING", "STOPPED"), ProviderView("RUNNING"), STOP),
    ("pending: cannot be stopped yet", stuck("STOPPING", "STOPPED"), ProviderView("PENDING"), ALERT),
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
    ("destroy never happened", stuck("DESTROYING", "DESTROYED"), ProviderView("RUNNING"), DESTROY),
    (
        "destroy of a stopped instance never happened",
        stuck("DESTROYING", "DESTROYED"),
        ProviderView("STOPPED"),
        DESTROY,
    ),
    ("destroy of a pending instance", stuck("DESTROYING", "DESTROYED"), ProviderView("PENDING"), DESTROY),
    ("stopping, and meant to be destroyed", stuck("STOPPING", "DESTROYED"), ProviderView("RUNNING"), DESTROY),
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
    elif expected in (STOP, DESTROY):
        assert isinstance(decision, ReissueCall)
        assert decision.operation == expected
        assert decision.end is (MachineState.STOPPED if expected == STOP else MachineState.DESTROYED)
        assert "1 of 2" in decision.details
    else:
        assert decision == expected


def test_a_reissue_is_followed_by_a_wait_then_another_then_an_alert() -> None:
    machine, view = stuck("STOPPING", "STOPPED", minutes=30), ProviderView("RUNNING")
    # Re-issued 4 minutes ago: it may still be under way — nothing, not even an alert.
    assert decide(NOW, machine, view, POLICY, [ago(minutes=4)]) is None
    # Five minutes on, and the provider still says running: the second re-issue.
    second = decide(NOW, machine, view, POLICY, [ago(minutes=5)])
    assert isinstance(second, ReissueCall) and "2 of 2" in second.details
    # Both spent: a human.
    spent = decide(NOW, machine, view, POLICY, [ago(minutes=12), ago(minutes=6)])
    assert isinstance(spent, AlertStuck) and "after 2 re-issued stops" in spent.details
    # A provider that agrees meanwhile finishes it, however recent the re-issue.
    done = decide(NOW, machine, ProviderView("STOPPED"), POLICY, [ago(minutes=1)])
    assert done == FinishTransition(MachineState.STOPPED)
    # A policy that allows none alerts at once.
    assert isinstance(decide(NOW, machine, view, replace(POLICY, reissues=0)), AlertStuck)


@pytest.mark.parametrize(
    ("machine", "reason"),
    [
        (replace(stuck("DESTROYING", "DESTROYED"), live_attempts=1), RefusalReason.WORK_PINNED),
        (replace(stuck("STOPPING", "STOPPED"), live_attempts=2), RefusalReason.WORK_PINNED),
        (replace(stuck("DESTROYING", "DESTROYED"), managed=False), RefusalReason.NOT_OURS),
    ],
    ids=["destroy with work on it", "stop with work on it", "not managed by us"],
)
def test_a_reissue_walks_the_ladder(machine: MachineSnapshot, reason: RefusalReason) -> None:
    assert decide(NOW, machine, ProviderView("RUNNING"), POLICY) == Refuse(reason)


def test_the_net_may_read_stop_and_destroy_but_never_create_or_start() -> None:
    from gpufleet.reaper.stuck_transition import StuckProvider

    methods = {m for c in StuckProvider.__mro__ for m in vars(c) if not m.startswith("_")}
    assert methods == {"get", "stop", "destroy"}


# A destroy the provider accepted and has not confirmed (a destroy_unconfirmed row): read on
# every pass, finished the moment the provider shows it gone, left alone while it still
# shows it — until the stuck limit, after which the ordinary rules apply.
UNCONFIRMED_CASES: list[tuple[str, MachineSnapshot, ProviderView, object]] = [
    (
        "a minute in, gone: destroyed",
        stuck("DESTROYING", "DESTROYED", minutes=1),
        ProviderView(GONE),
        FinishTransition(MachineState.DESTROYED),
    ),
    (
        "a minute in, still shutting down: left",
        stuck("DESTROYING", "DESTROYED", minutes=1),
        ProviderView("STOPPING"),
        None,
    ),
    (
        "a minute in, still running: left",
        stuck("DESTROYING", "DESTROYED", minutes=1),
        ProviderView("RUNNING"),
        None,
    ),
    (
        "a minute in, unreadable: refused",
        stuck("DESTROYING", "DESTROYED", minutes=1),
        ProviderView(error="TRANSIENT: throttled"),
        Refuse(RefusalReason.PROVIDER_UNREADABLE),
    ),
    (
        "past the stuck limit, still shutting down: re-issued",
        stuck("DESTROYING", "DESTROYED"),
        ProviderView("STOPPING"),
        DESTROY,
    ),
    ("a stop is never read early", stuck("STOPPING", "STOPPED", minutes=1), ProviderView("STOPPED"), None),
]


@pytest.mark.parametrize(
    ("machine", "view", "expected"), [c[1:] for c in UNCONFIRMED_CASES], ids=[c[0] for c in UNCONFIRMED_CASES]
)
def test_a_destroy_awaiting_confirmation(
    machine: MachineSnapshot, view: ProviderView, expected: object
) -> None:
    decision = decide(NOW, machine, view, POLICY, unconfirmed=True)
    if expected == DESTROY:
        assert isinstance(decision, ReissueCall) and decision.operation == "destroy"
    else:
        assert decision == expected


def test_without_an_unconfirmed_destroy_nothing_is_read_before_the_stuck_limit() -> None:
    early = stuck("DESTROYING", "DESTROYED", minutes=1)
    assert decide(NOW, early, ProviderView(GONE), POLICY) is None


def test_a_create_finished_running_keeps_the_sighting_its_boot_window_counts_from() -> None:
    """A create whose answer was lost, listed running 9 minutes ago: its boot window started
    then, not when the net finishes it (a hung boot is caught on time); never seen: now."""
    created = replace(stuck("PROVISIONING", "RUNNING", 12), first_observed_at=ago(minutes=9))
    values = finish_values(FinishTransition(MachineState.BOOTING, "i-1", "10.0.0.1:7000"), created, NOW)
    assert values == {
        "first_observed_at": ago(minutes=9),
        "provider_instance_id": "i-1",
        "agent_address": "10.0.0.1:7000",
    }
    never_seen = replace(created, first_observed_at=None)
    assert finish_values(FinishTransition(MachineState.BOOTING), never_seen, NOW) == {
        "first_observed_at": NOW
    }


def test_a_start_finished_running_keeps_its_sighting_too() -> None:
    """A start's intent emptied the column (a new life): a listing since set it."""
    started = replace(stuck("STARTING", "RUNNING", 12), first_observed_at=ago(minutes=8))
    assert finish_values(FinishTransition(MachineState.BOOTING), started, NOW) == {
        "first_observed_at": ago(minutes=8)
    }


@pytest.mark.parametrize(
    ("end", "values"),
    [
        (MachineState.STOPPED, {"stop_due_at": None}),
        (MachineState.DESTROYED, {"stop_due_at": None, "destroy_due_at": None}),
    ],
)
def test_a_stop_or_destroy_finished_clears_the_timers_it_ends(
    end: MachineState, values: dict[str, object]
) -> None:
    assert finish_values(FinishTransition(end), stuck("STOPPING", "STOPPED"), NOW) == values


@pytest.mark.parametrize("state", ["PROVISIONING", "STARTING", "STOPPING", "DESTROYING"])
def test_due_at_is_the_first_instant_the_net_reads_a_transition(state: str) -> None:
    """The net's requeue-after: ``stuck_after`` past the transition's start, not a
    microsecond earlier — or at once for a destroy awaiting confirmation."""
    machine = stuck(state, "DESTROYED" if state == "DESTROYING" else "STOPPED", minutes=0)
    at = due_at(machine, POLICY)
    assert at == machine.state_changed_at + POLICY.stuck_after
    before = at - timedelta(microseconds=1)
    assert gate(before, machine, POLICY) is None and gate(at, machine, POLICY) is not None
    awaiting = due_at(machine, POLICY, unconfirmed=True)
    assert awaiting == (machine.state_changed_at if state == "DESTROYING" else at)


@pytest.mark.parametrize("state", ["BOOTING", "READY", "STOPPED", "DESTROYED"])
def test_a_machine_in_no_transition_is_never_due(state: str) -> None:
    assert due_at(stuck(state, "RUNNING"), POLICY) is None


def test_only_the_present_transitions_rows_count() -> None:
    """Re-issues and incidents count from the transition's start on: rows of an earlier
    transition of the same machine (it moved on and got stuck again) are not this one's,
    and a row written the instant the transition began is."""
    machine = stuck("STOPPING", "STOPPED", minutes=30)
    began = machine.state_changed_at
    assert began is not None
    earlier, later = began - timedelta(seconds=1), began + timedelta(minutes=12)
    assert this_transition(machine, [earlier, began, later]) == [began, later]
    assert this_transition(machine, [earlier]) == []
    # A row with no transition recorded has none to count against.
    assert this_transition(replace(machine, state_changed_at=None), [earlier, later]) == []


def test_a_stuck_transition_opens_one_incident() -> None:
    """The net reads a stuck machine every pass: the first alert writes the row (the
    incident), the later ones of the same transition do not; a new transition opens anew."""
    machine = stuck("STOPPING", "STOPPED", minutes=30)
    began = machine.state_changed_at
    assert began is not None
    assert opens_incident(machine, [])
    assert not opens_incident(machine, [began + timedelta(minutes=10)])
    # Alerted in an earlier transition only: this one has not paged anybody yet.
    assert opens_incident(machine, [began - timedelta(hours=1)])
