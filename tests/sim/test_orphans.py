"""An instance the provider runs with nothing recorded here: the simulator's orphan sweep
writes the ledger's ``orphan_found`` row once it is past its grace, destroys it, and — as
the sweeper does — calls again at every pass that still lists it when a destroy is refused
(each refusal its ``provider_call_failed`` row)."""

from __future__ import annotations

import itertools
from functools import partial

from gpufleet.sim.nets import NetSettings
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.world import Sim
from tests.support.sim_script import OFFERING

SCRIPT = Script(
    offering=OFFERING, workspaces=(("ws", "creator"),), jobs=(ScriptedJob(10.0, "ws", "clip", 60.0),)
)


class RefusingOrphanDestroys(Sim):
    """The provider refuses the first ``refusals`` destroys of an orphan."""

    refusals = 0

    def _answer(self, op: str, zone: str, exists: bool = False) -> tuple[float, str]:
        latency, outcome = super()._answer(op, zone, exists)
        if op == "destroy" and self.orphans and self.refusals > 0:
            self.refusals -= 1
            return latency, "refused"
        return latency, outcome


def _run(refusals: int) -> tuple[Sim, list[float]]:
    sim = RefusingOrphanDestroys(SimConfig(days=3 / 24, machines=1, script=SCRIPT))
    sim.refusals = refusals
    sim.q.at(100.0, partial(sim._orphan, sim.offerings[0]))
    calls: list[float] = []
    destroy = sim._destroy_orphan

    def counted(iid: str, by: str) -> None:
        calls.append(sim.q.now)
        destroy(iid, by)

    sim._destroy_orphan = counted  # type: ignore[method-assign]
    sim.run()
    return sim, calls


def test_an_orphan_is_found_once_and_destroyed_past_its_grace() -> None:
    sim, calls = _run(0)
    grace = NetSettings().sweeper.orphan_grace_s
    assert sim.metrics.decisions["ledger:orphan_found"] == 1
    assert len(calls) == 1 and 100.0 + grace <= calls[0] <= 100.0 + grace + sim.every["orphan_sweep"]
    assert not sim.orphans
    assert sim.metrics.decisions["ledger:provider_call_failed"] == 0


def test_a_refused_orphan_destroy_is_called_again_at_each_pass_until_it_is_gone() -> None:
    sim, calls = _run(2)
    every = sim.every["orphan_sweep"]
    assert len(calls) == 3 and [b - a for a, b in itertools.pairwise(calls)] == [every, every]
    assert sim.metrics.decisions["ledger:provider_call_failed"] == 2
    assert sim.metrics.decisions["ledger:orphan_found"] == 1  # found once, however often called
    assert not sim.orphans
