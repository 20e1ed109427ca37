"""The films' writes decided once (earmark_updates): what a drain, a release and a film's
start do to each machine, and what they leave alone when the machine is no longer as the
decision read it. The scheduler's SQL applier and the simulator apply these updates."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.common.db.enums import MachineState
from gpufleet.scheduler.tick.earmark_updates import EarmarkRow, films_started, plan_updates
from gpufleet.scheduler.tick.model import Drain, Release

AT = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
READY, DRAINING, STOPPED = MachineState.READY, MachineState.DRAINING, MachineState.STOPPED


def rows(*found: EarmarkRow) -> dict[str, EarmarkRow]:
    return {r.machine_id: r for r in found}


def test_a_ready_unheld_machine_drains_for_its_film() -> None:
    [u] = plan_updates(rows(EarmarkRow("m1", READY, None)), [Drain("m1", "film", AT)], [])
    assert (u.to, u.earmark, u.action) == (DRAINING, "film", "drain")
    assert u.after == EarmarkRow("m1", DRAINING, "film")
    assert "draining for film film" in u.why


def test_a_drain_refuses_a_machine_no_longer_ready_or_held_for_another_film() -> None:
    found = rows(
        EarmarkRow("m1", STOPPED, None), EarmarkRow("m2", READY, "other"), EarmarkRow("m3", DRAINING, None)
    )
    drains = [Drain(m, "film", AT) for m in ("m1", "m2", "m3", "gone")]
    assert plan_updates(found, drains, []) == []


def test_a_release_readies_a_draining_machine_and_only_unearmarks_a_ready_one() -> None:
    found = rows(EarmarkRow("m1", DRAINING, "film"), EarmarkRow("m2", READY, "film"))
    releases = [Release("m1", "film", "it ran elsewhere"), Release("m2", "film", "it ran elsewhere")]
    one, two = plan_updates(found, [], releases)
    assert (one.to, one.earmark, one.action) == (READY, None, "earmark_released")
    assert (two.to, two.earmark) == (None, None)
    assert "it ran elsewhere" in one.why


def test_a_release_for_a_film_the_machine_no_longer_names_is_nothing() -> None:
    assert plan_updates(rows(EarmarkRow("m1", DRAINING, "newer")), [], [Release("m1", "film", "x")]) == []


def test_a_release_then_a_drain_of_one_machine_apply_in_order() -> None:
    """Releases first, each drain against the machine as they left it."""
    updates = plan_updates(
        rows(EarmarkRow("m1", DRAINING, "old")), [Drain("m1", "new", AT)], [Release("m1", "old", "cancelled")]
    )
    assert [(u.read.state, u.to, u.earmark) for u in updates] == [
        (DRAINING, READY, None),
        (READY, DRAINING, "new"),
    ]


def test_a_film_started_frees_every_machine_held_for_it() -> None:
    found = [
        EarmarkRow("m1", DRAINING, "film"),  # where it starts: done draining
        EarmarkRow("m2", DRAINING, "film"),  # held too: ordinary capacity again
        EarmarkRow("m3", READY, "film"),
        EarmarkRow("m4", DRAINING, "other"),  # another film's: untouched
    ]
    updates = films_started(found, {"film": "m1"})
    assert [(u.read.machine_id, u.to, u.earmark) for u in updates] == [
        ("m1", READY, None),
        ("m2", READY, None),
        ("m3", None, None),
    ]
    assert updates[0].why == "film film started here"
    assert updates[1].why == "film film started on machine m1"
