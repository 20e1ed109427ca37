"""A failure's design limit counts what the design itself holds it for: went silent never
acts within its grace after a machine comes up, so a worker that dies then is caught no
sooner than the grace's end (a 300 s threshold swept under the 10-minute grace made one
such death read as late)."""

from __future__ import annotations

from gpufleet.reaper.settings import Settings as ReaperSettings
from gpufleet.sim.nets import NetSettings
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.report import summarize
from gpufleet.sim.world import Sim
from tests.support.sim_script import OFFERING


def test_a_worker_dying_inside_the_grace_is_not_late() -> None:
    script = Script(
        offering=OFFERING,
        workspaces=(("ws", "creator"),),
        jobs=(ScriptedJob(10.0, "ws", "clip", 900.0),),
        call_s=0.0,
        worker_deaths=((1, 20.0),),  # 20 s after its first report, well inside the grace
    )
    reaper = ReaperSettings.model_construct(went_silent_after_s=300.0)
    sim = Sim(
        SimConfig(days=1 / 24, machines=2, tick_s=10.0, script=script),
        "nets",
        settings=NetSettings(reaper=reaper),
    )
    sim.run()
    (death,) = [f for f in sim.failures if f.cls == "worker_dies"]
    assert death.caught_at is not None
    grace = reaper.went_silent_policy().grace.total_seconds()
    # Held for the rest of the grace, which outlasts the threshold ...
    assert death.held_s > reaper.went_silent_after_s
    assert abs(death.held_s - (grace - 20.0 - script.startup_s - script.agent_up_s)) <= 60.0
    # ... and caught within it (plus a cadence): not late.
    report = summarize(sim, 1.0)["detections"]["worker_dies"]
    assert report["caught"] == 1 and report["late"] == 0
    assert death.caught_at - death.at > report["threshold_s"] + report["cadence_s"]
