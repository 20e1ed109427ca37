"""The seed's argument against one merged health check, played side by side in one
running control plane.

Machine A: its worker dies while the provider keeps listing the instance and its agent
keeps answering — two of three channels warm, so a composite "is anything in contact?"
stays fresh; went silent, on the worker's own clock, destroys it. Machine B: the path to
it drops while its worker keeps reporting — the probe is cold; the lost detector marks
it and takes it out of rotation, and a day later it is still running.
"""

from __future__ import annotations

from datetime import timedelta

from gpufleet.common.convert import composite_liveness
from gpufleet.provisioner.drivers.base import InstanceStatus
from tests.integration.reaper.plane import running_plane


def test_went_silent_destroys_the_dead_worker_and_the_unreachable_one_only_loses_rotation(
    pg_url: str,
) -> None:
    with running_plane(pg_url) as plane:
        dead_worker = plane.machine()
        unreachable = plane.machine()
        plane.agents[dead_worker].busy(gpu=97.0, running=1)  # wedged, holding the GPU
        plane.agents[unreachable].busy(requests=3)
        plane.reporting |= {dead_worker, unreachable}
        plane.tick()
        plane.reporting.discard(dead_worker)
        plane.agents[unreachable].reachable = False
        died = plane.clock.now()

        for _ in range(28):  # 14 minutes
            plane.step(30)
        a = plane.row(dead_worker)
        assert a.state == "READY"
        composite_at, _channel = composite_liveness(a)
        assert composite_at == plane.clock.now()  # the merged view: alive
        assert a.provider_seen_at == plane.clock.now() and a.probe_ok_at == plane.clock.now()
        while plane.clock.now() < died + timedelta(minutes=16):
            plane.step(30)
        assert plane.row(dead_worker).state == "DESTROYED"
        assert plane.ledger(dead_worker) == [("went_silent", "went_silent", "REPLACE_MACHINE")]

        for _ in range(24 * 3):  # a day later
            plane.step(20 * 60)
        b = plane.row(unreachable)
        assert (b.state, b.lost) == ("READY", True)
        assert plane.instance_status(unreachable) is InstanceStatus.RUNNING
        assert plane.provider_ops(unreachable) == []
        assert plane.ledger(unreachable) == [("machine_lost", "lost_detector", "NOTHING")]
        assert plane.acted(dead_worker) == {"went_silent": {"destroy"}}
        assert plane.acted(unreachable) == {"lost_detector": {"mark_lost"}}
