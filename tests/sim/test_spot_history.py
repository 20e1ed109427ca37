"""A spot machine's history (pre-emptions over its spot hours: the scale step's expected
cost) is written by the simulator as production writes it (gpufleet.common.spot_history):
a net's stop adds the run since the machine was first observed running, a pre-emption adds
the run it cut short and counts one — never the time the instance billed while it booted."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from gpufleet.common import spot_history
from gpufleet.common.ledger import FailureClass
from gpufleet.reaper.net_runner import Claim
from gpufleet.reaper.transition import Transition
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.records import Machine
from gpufleet.sim.world import Sim
from tests.support.sim_script import OFFERING

SPOT = replace(OFFERING, id="sim-l4-spot", capacity_type="SPOT")


class WatchedSim(Sim):
    """Notes when each machine was first observed running, as the claim's snapshot says."""

    def __init__(self, cfg: SimConfig) -> None:
        super().__init__(cfg, "nets")
        self.claimed: dict[str, tuple[float, float]] = {}

    def _stop_or_destroy(
        self, m: Machine, transition: Transition, fc: FailureClass | None, claim: Claim | None = None
    ) -> None:
        first = m.first_observed(self.q.now)
        self.claimed.setdefault(m.id, (self.q.now, first))
        super()._stop_or_destroy(m, transition, fc, claim)


def _run(script: Script, hours: float) -> WatchedSim:
    sim = WatchedSim(SimConfig(days=hours / 24, machines=2, tick_s=10.0, script=script))
    sim.run()
    return sim


def _at(sim: Sim, machine: str, state: str) -> float:
    assert sim.history is not None
    return next(
        t for t, what, ident, s in sim.history if what == "machine" and ident == machine and s == state
    )


def test_a_net_stopping_a_spot_machine_adds_its_run_since_first_observed() -> None:
    script = Script(
        offering=SPOT, workspaces=(("ws", "creator"),), jobs=(ScriptedJob(10.0, "ws", "clip", 300.0),)
    )
    sim = _run(script, 2.0)
    (m,) = sim.machines.values()
    claimed_at, first = sim.claimed[m.id]
    assert claimed_at == _at(sim, m.id, "STOPPING")  # the money chain's idle stop
    assert m.preemptions == 0
    assert abs(m.spot_seconds - (claimed_at - first)) < 1e-3
    # The instance billed from its create to its stop's end; its boot before it was first
    # observed, and the stop itself, are not spot run time.
    assert first > _at(sim, m.id, "PROVISIONING")
    assert m.spot_seconds < _at(sim, m.id, "STOPPED") - _at(sim, m.id, "PROVISIONING")


def test_a_preemption_counts_one_and_adds_the_run_it_cut_short() -> None:
    script = Script(
        offering=SPOT,
        workspaces=(("ws", "creator"),),
        jobs=(ScriptedJob(10.0, "ws", "clip", 3000.0),),
        preemptions=((1, 600.0),),
    )
    sim = _run(script, 2.0)
    first_machine = sim.machines[min(sim.machines)]
    assert first_machine.preemptions == 1
    assert first_machine.id not in sim.claimed  # taken by the cloud, not stopped by a net
    gone = _at(sim, first_machine.id, "DESTROYED")
    up = _at(sim, first_machine.id, "READY")
    # Its run: from when it was first observed (before it was ready) to the loss.
    assert gone - up < first_machine.spot_seconds < gone - _at(sim, first_machine.id, "PROVISIONING")


def test_the_rule_adds_nothing_for_on_demand_or_a_machine_not_running() -> None:
    now = datetime(2026, 12, 5, tzinfo=UTC)
    first = now - timedelta(hours=2)
    assert spot_history.claimed_s(True, "READY", first, now) == 7200.0
    assert spot_history.claimed_s(False, "READY", first, now) == 0.0
    assert spot_history.claimed_s(True, "STOPPED", first, now) == 0.0
    assert spot_history.claimed_s(True, "BOOTING", None, now) == 0.0
    assert spot_history.ran_s(now + timedelta(seconds=5), now) == 0.0
