"""A spot machine taken back before its provider's list ever showed it is kept, as the
inventory reconcile keeps it (``not_listed_grace_s``: a list lags creates, and a record
dropped on that absence leaks the instance that then appears), and lost once the grace has
passed. The simulator decides it with the reconcile's own rule and the sweeper's setting;
its detection limit for that pre-emption is the grace the design holds it for."""

from __future__ import annotations

from dataclasses import replace

from gpufleet.sim.nets import NetSettings, validated
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.records import Machine
from gpufleet.sim.report import summarize
from gpufleet.sim.world import Sim
from tests.support.sim_script import OFFERING

SPOT = replace(OFFERING, id="sim-l4-spot", capacity_type="SPOT")
SCRIPT = Script(
    offering=SPOT, workspaces=(("ws", "creator"),), jobs=(ScriptedJob(10.0, "ws", "clip", 600.0),)
)
TAKEN_AFTER_S = 30.0  # after its instance runs: before the first listing (every 60 s)


class EarlyPreemption(Sim):
    """The first machine's instance is taken back 30 s after it starts running."""

    def _scripted_life(self, m: Machine, boot_at: float) -> None:
        if m.ordinal == 1 and m.life == 1:
            life = m.life
            self.q.at(boot_at + TAKEN_AFTER_S, lambda: self._preempt(m, life))
        super()._scripted_life(m, boot_at)


def _run(settings: NetSettings) -> tuple[Sim, float, float]:
    sim = EarlyPreemption(SimConfig(days=1 / 24, machines=2, tick_s=10.0, script=SCRIPT), settings=settings)
    sim.run()
    assert sim.history is not None
    first = min(sim.machines)
    requested = next(t for t, what, ident, _ in sim.history if what == "machine" and ident == first)
    lost = next(
        t for t, what, ident, s in sim.history if what == "machine" and ident == first and s == "DESTROYED"
    )
    return sim, requested, lost


def test_a_machine_never_listed_is_kept_for_the_grace_then_lost() -> None:
    settings = NetSettings()
    grace = settings.sweeper.not_listed_grace_s
    sim, requested, lost = _run(settings)
    assert sim.metrics.refusals["inventory_reconcile:NOT_YET_LISTED"] > 1  # one a pass ...
    assert sim.metrics.decisions["ledger:not_yet_listed"] == 1  # ... one ledger row a machine
    # Lost at the first pass after the grace (every pass on a 60 s grid), not before.
    assert requested + grace <= lost <= requested + grace + sim.every["inventory_reconcile"]
    out = summarize(sim, 0.0)
    d = out["detections"]["preemption"]
    assert (d["injected"], d["caught"], d["late"]) == (1, 1, 0)
    assert out["missed_or_late_detections"] == 0


def test_with_no_grace_it_is_lost_at_the_next_pass() -> None:
    sim, requested, lost = _run(validated("not_listed_grace_s", "0"))
    assert sim.metrics.refusals["inventory_reconcile:NOT_YET_LISTED"] == 0
    assert lost < requested + 300.0  # the create, the boot and one pass: well inside the default grace
