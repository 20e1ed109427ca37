"""A start begins a new life of the machine: its intent, written by the real fleet tick's
scale step on PostgreSQL, empties ``first_observed_at``, so no net counts the new boot from
the earlier life's sighting. Only this life's first listing, probe or report — or the
start's own answer — sets it again (a start whose answer is lost is finished to BOOTING by
the stuck-transition net, which keeps that sighting: stuck_transition.finish_values)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import update

from gpufleet.common.db import models
from gpufleet.common.loops import TickReport
from gpufleet.scheduler.tick.model import StartMachine
from tests.integration.scheduler.metered_fleet import MeteredFleet, catalogue, metered_fleet


@pytest.fixture
def fleet(pg_url: str) -> Iterator[MeteredFleet]:
    with metered_fleet(pg_url, catalogue(warm_target=0)) as fleet:
        yield fleet


def test_a_start_forgets_the_earlier_lifes_first_sighting(fleet: MeteredFleet) -> None:
    machine_id = fleet.machine()
    earlier = fleet.clock.now() - timedelta(hours=5)
    with fleet.sessions() as s, s.begin():
        s.execute(
            update(models.Machine)
            .where(models.Machine.id == machine_id)
            .values(state="STOPPED", intent="STOPPED", first_observed_at=earlier)
        )
    report = TickReport()
    fleet.leader().scale.record([StartMachine(machine_id)], fleet.clock.now(), report)
    assert report.actions["start"] == 1
    with fleet.sessions() as s:
        row = s.get_one(models.Machine, machine_id)
        # Empty until this life is seen; the start's answer (if the call pool has had it
        # already) writes the answer's time: never the earlier life's.
        assert row.first_observed_at in (None, fleet.clock.now())
        assert row.state in ("STARTING", "BOOTING", "STOPPED")
