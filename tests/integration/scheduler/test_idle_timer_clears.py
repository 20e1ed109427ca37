"""The idle chain's timers the scheduler takes off, as an operator counts them in
``gpufleet.reaper.idle.timers``: real fleet ticks on PostgreSQL (``metered_fleet``). Work
assigned to a machine whose stop timer the reaper armed, or a stopped machine started for
work with its destroy timer still set, is one ``cleared`` once the tick's transaction has
committed; a machine whose timers were not set clears nothing and counts nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select, text, update

from gpufleet.common.db import models
from gpufleet.common.metrics.catalog import REAPER_IDLE_TIMERS
from gpufleet.scheduler.tick.idle_timers import clear_for_work
from tests.integration.scheduler.metered_fleet import MeteredFleet, metered_fleet


@pytest.fixture
def fleet(pg_url: str) -> Iterator[MeteredFleet]:
    with metered_fleet(pg_url) as fleet:
        yield fleet


def timers(fleet: MeteredFleet) -> dict[str, float]:
    return {dict(k)["action"]: v for k, v in fleet.probe.series(REAPER_IDLE_TIMERS.name).items()}


def armed(fleet: MeteredFleet, machine_id: str) -> tuple[bool, bool]:
    with fleet.sessions() as s:
        m = s.get_one(models.Machine, machine_id)
        return m.stop_due_at is not None, m.destroy_due_at is not None


def machines_with_work(fleet: MeteredFleet) -> set[str]:
    with fleet.sessions() as s:
        return set(s.execute(select(models.Attempt.machine_id)).scalars())


def test_work_assigned_to_a_machine_with_an_armed_stop_timer_counts_one_cleared(fleet: MeteredFleet) -> None:
    now = fleet.clock.now()
    # The reaper's idle scanner armed this one a minute ago; the other was never idle.
    idle = fleet.machine(stop_due_at=now + timedelta(minutes=4), destroy_due_at=now + timedelta(hours=2))
    busy = fleet.machine()
    for n in range(4):
        fleet.job(f"short-{n}")

    assert fleet.tick().actions["assign"] == 4
    assert machines_with_work(fleet) == {idle, busy}
    assert armed(fleet, idle) == (False, False)
    assert timers(fleet) == {"cleared": 1}

    fleet.tick(after_s=10)  # nothing new assigned: nothing more taken off
    assert timers(fleet) == {"cleared": 1}


def test_a_stopped_machine_started_for_work_counts_its_timers_cleared(fleet: MeteredFleet) -> None:
    now = fleet.clock.now()
    # Stopped by the idle chain (its destroy timer still counting down), and one stopped
    # by hand with no timer.
    chained = fleet.machine(state="STOPPED", destroy_due_at=now + timedelta(hours=1), agent_address=None)
    by_hand = fleet.machine(state="STOPPED", agent_address=None)
    for n in range(4):
        fleet.job(f"short-{n}")

    report = fleet.tick()
    assert report.actions["start"] == 2
    assert armed(fleet, chained) == (False, False) and armed(fleet, by_hand) == (False, False)
    assert timers(fleet) == {"cleared": 1}


def test_an_arm_committing_while_work_is_assigned_is_waited_for_cleared_and_counted(
    fleet: MeteredFleet,
) -> None:
    """The reaper arms a machine in the very moment the tick assigns it work: the clear
    waits for the arm's commit, takes the timers off and counts them (the scan that read
    no timer is not what is counted)."""
    machine = fleet.machine()
    arm = fleet.sessions()
    arm.begin()
    arm.execute(
        update(models.Machine)
        .where(models.Machine.id == machine)
        .values(stop_due_at=fleet.clock.now() + timedelta(minutes=5))
    )
    found: list[int] = []

    def assign() -> None:
        with fleet.sessions() as s, s.begin():
            found.append(clear_for_work(s.connection(), [machine]))

    assigning = threading.Thread(target=assign)
    assigning.start()
    try:
        wait_for_a_lock_wait(fleet)
    finally:
        arm.commit()
        arm.close()
        assigning.join(30)
    assert found == [1]
    assert armed(fleet, machine) == (False, False)


def wait_for_a_lock_wait(fleet: MeteredFleet, timeout_s: float = 10.0) -> None:
    """Until a backend of this database waits on a row lock (the clear, behind the arm)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with fleet.sessions() as s:
            waiting = s.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the clear never waited for the arm's row lock")
