"""The seed's fifth row — "an instance exists at the provider with nothing recorded here"
— is caught by the orphan sweep and by no other net: every net that starts from our own
inventory is blind to it, because it is not in it.

The reaper's nets (as ``main.build_watchdogs`` wires them) and the inventory reconcile run
for hours of clock time beside the orphan and never touch it; the orphan sweep, turned on,
finds it and removes it once its grace window has passed.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import select

from gpufleet.common.clock import ManualClock
from gpufleet.common.db.models import WatchdogStat
from gpufleet.common.loops import Ticker
from gpufleet.sweeper.settings import Settings
from tests.integration.reaper.conftest import Chain, wire_reaper
from tests.integration.sweeper.conftest import Sweep, wire_sweeper
from tests.support.sim_provisioner import SimProvisioner, serve_sim_provisioner

ORPHAN = "m-seed-orphan"
FIVE_MIN = 300.0


@pytest.fixture
def fleet(db_url: str) -> Iterator[tuple[Sweep, Chain]]:
    clock = ManualClock()
    with (
        serve_sim_provisioner(clock) as sim,
        wire_sweeper(db_url, clock, sim.address, sim) as sweep,
        wire_reaper(db_url, clock, sim.address, sim) as reaper,
    ):
        yield sweep, reaper


def calls_about(sim: SimProvisioner, machine_id: str) -> list[str]:
    return [c.op for c in sim.cloud.calls if c.machine_id == machine_id]


def test_only_the_orphan_sweep_finds_an_instance_with_no_record_here(fleet: tuple[Sweep, Chain]) -> None:
    sweep, reaper = fleet
    sim: SimProvisioner = sweep.provisioner
    sim.create(ORPHAN)
    # Every other net: the reaper's, and the reconcile (which reads the same list as the
    # sweep but only ever looks up machines it has a record of).
    [reconcile_task, _] = sweep.passes.tasks(Settings())
    others = Ticker("sweeper", sweep.clock, sweep.sessions, sweep.lease, [reconcile_task], renew_s=5)

    def step_others(seconds: float) -> None:
        sweep.clock.advance(timedelta(seconds=seconds))
        reaper.tick()
        sweep.lease.try_acquire()
        others.run_due()

    for _ in range(75):  # two and a half hours: past every threshold those nets have
        step_others(120)
    assert sim.instance(ORPHAN) is not None, "another net touched the orphan"
    assert calls_about(sim, ORPHAN) == ["create"]
    assert sweep.failures() == [] and sweep.incidents() == []
    with sweep.sessions() as s:
        ran = {r.name: r.runs for r in s.execute(select(WatchdogStat)).scalars()}
    assert ran.pop("orphan_sweep") == 0  # off so far
    assert ran.pop("inventory_reconcile") >= 75
    assert ran and all(runs >= 75 for runs in ran.values()), ran  # every reaper net ran throughout

    # The orphan sweep, beside them: it sees the orphan now, keeps it through its grace
    # window (it first saw it just now, however old it is), then removes it.
    def step_all(seconds: float) -> None:
        sweep.clock.advance(timedelta(seconds=seconds))
        reaper.tick()
        sweep.tick()

    first_seen = sweep.clock.now()
    sweep.tick()
    for _ in range(5):
        step_all(FIVE_MIN)
    assert sim.instance(ORPHAN) is not None
    assert sweep.orphan_rows()[ORPHAN].action == "WAITING"
    step_all(FIVE_MIN)
    assert sim.instance(ORPHAN) is None
    assert calls_about(sim, ORPHAN) == ["create", "destroy"]
    [found] = sweep.failures()
    assert (found.failure_class, found.detector, found.machine_id) == ("orphan_found", "orphan_sweep", ORPHAN)
    row = sweep.orphan_rows()[ORPHAN]
    assert (row.action, row.first_seen_at, row.destroyed_at) == (
        "DESTROYED",
        first_seen,
        first_seen + timedelta(minutes=30),
    )
