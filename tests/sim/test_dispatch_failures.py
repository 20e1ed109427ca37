"""A dispatch the simulator cannot start ends as the scheduler's dispatch ends it:

- an agent the path does not reach answers no try of StartJobs, so the dispatch gives up
  once the agent client's whole schedule has run (``grpcclient.unanswered_s``), takes the
  attempt back with a ``job_infra_error`` ledger row and backs the machine off
  (``BACKS_OFF`` of the status it read); with a dispatch deadline shorter than that, the
  tick's take-back of overdue dispatches (``overdue``) comes first;
- an agent that answers hands the attempt to its worker whether the worker lives or not:
  a dead worker never runs it, and its lease runs out (``worker_lost``), not a take-back."""

from __future__ import annotations

import math

from gpufleet.common import grpcclient
from gpufleet.common.clients.agent import TIMEOUT_S
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.sim.nets import NetSettings
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.world import Sim
from tests.support.sim_script import OFFERING, job_moves

TICK_S = 10.0
BOOTED = 1.0 + 60.0 + 60.0  # the scripted create's answer, the agent, the worker's first report


def _run(
    script: Script, settings: NetSettings | None = None
) -> tuple[Sim, dict[str, list[tuple[float, str]]]]:
    sim = Sim(SimConfig(days=1 / 24, machines=1, tick_s=TICK_S, script=script), settings=settings)
    sim.run()
    return sim, job_moves(sim)


def _dropped(jobs: tuple[ScriptedJob, ...]) -> Script:
    # The path to the machine's agent drops 200 s after its worker first reports, for 20
    # minutes; the worker still reports (its calls go out), so the tick still places work.
    return Script(
        offering=OFFERING,
        workspaces=(("ws", "studio"),),
        jobs=jobs,
        path_drops=((1, 200.0, 1200.0),),
    )


def test_a_dispatch_to_an_agent_the_path_drops_is_taken_back_when_the_call_gives_up() -> None:
    sim, moves = _run(
        _dropped((ScriptedJob(10.0, "ws", "clip", 60.0), ScriptedJob(400.0, "ws", "clip", 60.0)))
    )
    first, second = sorted(moves)
    assert [s for _, s in moves[first]][-1] == "SUCCEEDED"  # ran before the drop
    dispatched = [t for t, s in moves[second] if s == "DISPATCHING"]
    requeued = [t for t, s in moves[second] if s == "QUEUED"][1:]  # after its arrival
    unanswered = grpcclient.unanswered_s(TIMEOUT_S, idempotent=True)
    assert unanswered == 3 * TIMEOUT_S + 0.2 + 0.4
    # Each dispatch while the path is down is taken back when the call gives up.
    assert requeued and requeued[0] == dispatched[0] + unanswered
    taken = sim.metrics.attempt_ends["taken_back"]
    assert taken == len(requeued)
    assert sim.metrics.decisions["ledger:job_infra_error"] == taken
    # The machine backs off after each (30 s, doubling): no dispatch inside a back-off.
    backoff = SchedulerSettings().dispatch_backoff_s
    assert dispatched[1] - requeued[0] >= backoff
    if len(dispatched) > 2:
        assert dispatched[2] - requeued[1] >= 2 * backoff


def test_a_dispatch_deadline_shorter_than_the_call_takes_it_back_at_the_first_tick_past_it() -> None:
    scheduler = SchedulerSettings.model_construct(dispatch_deadline_s=5.0)
    sim, moves = _run(
        _dropped((ScriptedJob(10.0, "ws", "clip", 60.0), ScriptedJob(400.0, "ws", "clip", 60.0))),
        NetSettings(scheduler=scheduler),
    )
    second = sorted(moves)[1]
    dispatched = next(t for t, s in moves[second] if s == "DISPATCHING")
    requeued = [t for t, s in moves[second] if s == "QUEUED"][1]
    assert requeued == (math.floor((dispatched + 5.0) / TICK_S) + 1) * TICK_S
    assert requeued < dispatched + grpcclient.unanswered_s(TIMEOUT_S, idempotent=True)
    assert sim.metrics.decisions["ledger:job_infra_error"] == sim.metrics.attempt_ends["taken_back"] > 0


def test_an_agent_that_answers_takes_the_job_for_a_dead_worker_and_its_lease_runs_out() -> None:
    # The worker dies 100 s after its first report; a job arrives 10 s later, while its
    # last report is still fresh enough for the tick to place work there.
    script = Script(
        offering=OFFERING,
        workspaces=(("ws", "studio"),),
        jobs=(ScriptedJob(10.0, "ws", "clip", 30.0), ScriptedJob(BOOTED + 10.0 + 110.0, "ws", "clip", 60.0)),
        worker_deaths=((1, 100.0),),
    )
    sim, moves = _run(script)
    second = sorted(moves)[1]
    states = [s for _, s in moves[second]]
    assert "RUNNING" in states  # the agent said it started
    assert sim.metrics.attempt_ends["worker_lost"] >= 1
    assert sim.metrics.attempt_ends["taken_back"] == 0
