"""A machine whose row lags its instance is judged once the row catches up.

A create whose answer is lost leaves the row PROVISIONING while the provider's instance
runs, its agent answers the idle scanner's probes and its worker reports; the
stuck-transition net finishes the create once it is ``stuck_after`` old. If the agent's
path drops meanwhile, the lost detector — which reads only running machines — must judge
the machine from the moment the row says it runs, as its scan would: the simulator once
scheduled that judgement only when the path dropped, and so never made it."""

from __future__ import annotations

from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.world import Sim
from tests.support.sim_script import OFFERING

CALL_S = 1.0


def test_a_path_dropped_while_the_row_lagged_is_caught_once_the_row_runs() -> None:
    script = Script(
        offering=OFFERING,
        workspaces=(("ws", "creator"),),
        jobs=(ScriptedJob(10.0, "ws", "clip", 600.0),),
        call_s=CALL_S,
        # 5 s after the worker's first report, for an hour.
        path_drops=((1, 5.0, 3600.0),),
    )
    sim = Sim(SimConfig(days=3 / 24, machines=1, tick_s=10.0, script=script))
    answer = sim._answer
    lost: list[str] = []

    def first_create_lost(op: str, zone: str, exists: bool = False) -> tuple[float, str]:
        if op == "create" and not lost:
            lost.append(op)
            return CALL_S, "lost"  # the provider made it; no one hears so
        return answer(op, zone, exists)

    sim._answer = first_create_lost  # type: ignore[method-assign]
    sim.run()
    assert sim.history is not None
    moves = [(t, state) for t, what, _, state in sim.history if what == "machine"]
    booting = next(t for t, state in moves if state == "BOOTING")
    (drop,) = [f for f in sim.failures if f.cls == "path_drop"]
    assert drop.at < booting  # the path dropped while the row still said PROVISIONING
    assert drop.caught_by == "lost_detector"
    # Within the detector's own bound, counted from when the row ran.
    limit = sim.every["idle_scanner"] + sim.lost_after_s + sim.every["lost_detector"]
    assert booting < drop.caught_at <= booting + limit
