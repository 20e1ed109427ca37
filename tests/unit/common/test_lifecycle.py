"""The machine lifecycle: every (from, to, actor) move against the table, the shape of the
table itself, and the compare-and-set writer on a real SQLite database."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.enums import MachineState
from gpufleet.common.db.models import Machine
from gpufleet.common.lifecycle import (
    FINAL,
    TRANSITIONS,
    Actor,
    IllegalTransition,
    allowed,
    check,
    record,
    transition,
)
from tests.support.fleet_rows import add_machine

S = MachineState
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

EVERY_MOVE = list(itertools.product(MachineState, MachineState, Actor))


@pytest.mark.parametrize(
    ("from_", "to", "by"), EVERY_MOVE, ids=[f"{f.value}->{t.value}-by-{a.value}" for f, t, a in EVERY_MOVE]
)
def test_a_move_is_allowed_exactly_when_the_table_says_so(
    from_: MachineState, to: MachineState, by: Actor
) -> None:
    in_table = by in TRANSITIONS.get((from_, to), frozenset())
    assert allowed(from_, to, by) is in_table
    if in_table:
        assert check([from_], to, by) == (from_,)
    else:
        with pytest.raises(IllegalTransition, match=f"{by.value} may not move a machine from {from_.value}"):
            check([from_], to, by)


def test_the_table_names_only_real_states_and_actors_and_no_empty_or_standing_moves() -> None:
    for (from_, to), actors in TRANSITIONS.items():
        assert isinstance(from_, MachineState) and isinstance(to, MachineState)
        assert from_ is not to, f"{from_.value} -> itself is not a move"
        assert actors and all(isinstance(a, Actor) for a in actors)


def test_a_destroyed_machine_never_moves_again() -> None:
    assert S.DESTROYED in FINAL and len(FINAL) == 1
    assert not [move for move in TRANSITIONS if move[0] in FINAL]
    for to, by in itertools.product(MachineState, Actor):
        assert not allowed(S.DESTROYED, to, by)


def test_every_state_can_reach_destroyed_and_be_reached_from_provisioning() -> None:
    def reachable(start: MachineState) -> set[MachineState]:
        seen, todo = {start}, [start]
        while todo:
            here = todo.pop()
            for f, t in TRANSITIONS:
                if f is here and t not in seen:
                    seen.add(t)
                    todo.append(t)
        return seen

    assert reachable(S.PROVISIONING) == set(MachineState)
    for state in MachineState:
        assert S.DESTROYED in reachable(state), state


def test_a_worker_only_ever_says_its_machine_is_up() -> None:
    assert [move for move, actors in TRANSITIONS.items() if Actor.WORKER in actors] == [(S.BOOTING, S.READY)]


def test_one_illegal_state_among_several_fails_the_whole_check() -> None:
    assert check([S.READY, S.DRAINING], S.STOPPING, Actor.REAPER) == (S.READY, S.DRAINING)
    with pytest.raises(IllegalTransition, match="from STOPPED to STOPPING"):
        check([S.READY, S.STOPPED], S.STOPPING, Actor.REAPER)


# --- the writers, on SQLite -------------------------------------------------------------


@pytest.fixture
def sessions(sqlite_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(sqlite_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def row(sessions: sessionmaker[Session], machine_id: str) -> Machine:
    with sessions() as s:
        return s.get_one(Machine, machine_id)


def test_transition_is_a_compare_and_set_the_first_writer_wins(sessions: sessionmaker[Session]) -> None:
    mid = add_machine(sessions, NOW, state="READY")
    # Both writers saw READY (each in its own, closed scan) before either wrote.
    seen_by_reaper = seen_by_sweeper = S(row(sessions, mid).state)
    first = NOW + timedelta(seconds=1)
    with sessions() as s, s.begin():
        won = transition(
            s,
            mid,
            seen_by_reaper,
            S.DESTROYING,
            by=Actor.REAPER,
            why="went_silent: no report for 10m",
            now=first,
            intent="DESTROYED",
        )
    with sessions() as s, s.begin():
        lost = transition(
            s,
            mid,
            seen_by_sweeper,
            S.DESTROYED,
            by=Actor.SWEEPER,
            why="inventory_reconcile: instance vanished",
            now=first + timedelta(seconds=1),
            intent="DESTROYED",
        )
    assert (won, lost) == (True, False)
    after = row(sessions, mid)
    assert (after.state, after.intent, after.state_changed_at) == ("DESTROYING", "DESTROYED", first)
    assert (after.state_changed_by, after.state_reason) == ("reaper", "went_silent: no report for 10m")


def test_transition_checks_the_callers_own_conditions_too(sessions: sessionmaker[Session]) -> None:
    mid = add_machine(sessions, NOW, state="READY", stop_due_at=NOW + timedelta(minutes=5))
    with sessions() as s, s.begin():
        early = transition(
            s,
            mid,
            S.READY,
            S.STOPPING,
            by=Actor.REAPER,
            why="auto_stop: idle",
            now=NOW,
            where=[Machine.stop_due_at <= NOW],
        )
    assert early is False
    before = row(sessions, mid)
    assert (before.state, before.state_changed_by, before.state_reason) == ("READY", "", "")


def test_transition_refuses_a_move_the_table_does_not_have_before_writing(
    sessions: sessionmaker[Session],
) -> None:
    mid = add_machine(sessions, NOW, state="STOPPED")
    with sessions() as s, s.begin(), pytest.raises(IllegalTransition):
        transition(s, mid, S.STOPPED, S.READY, by=Actor.WORKER, why="a heartbeat from a stopped box", now=NOW)
    assert row(sessions, mid).state == "STOPPED"


def test_the_reason_is_kept_to_its_column(sessions: sessionmaker[Session]) -> None:
    mid = add_machine(sessions, NOW, state="BOOTING")
    with sessions() as s, s.begin():
        assert transition(s, mid, S.BOOTING, S.READY, by=Actor.WORKER, why="x" * 600, now=NOW)
    assert row(sessions, mid).state_reason == "x" * 500


def test_record_moves_a_loaded_row_and_refuses_an_illegal_move(sessions: sessionmaker[Session]) -> None:
    mid = add_machine(sessions, NOW, state="STOPPED")
    with sessions() as s, s.begin():
        machine = s.get_one(Machine, mid, with_for_update=True)
        with pytest.raises(IllegalTransition):
            record(machine, S.READY, by=Actor.FLEET_TICK, why="no such move", now=NOW)
        assert machine.state == "STOPPED"
        record(machine, S.STARTING, by=Actor.FLEET_TICK, why="work is waiting", now=NOW)
    after = row(sessions, mid)
    assert (after.state, after.state_changed_at, after.state_changed_by, after.state_reason) == (
        "STARTING",
        NOW,
        "fleet_tick",
        "work is waiting",
    )
