"""A control-plane restart loses what its processes had in flight, as production does.

A deploy rolls every service's replicas: the leaders' processes die with the calls they had
made, and the new leaders pick up what the rows say was under way — the fleet tick's adopt
makes a pending create or start again (idempotent at the provider), dispatches again an
attempt still STARTING within the dispatch deadline and takes back one past it
(``NOT_DISPATCHED``); a stop or destroy whose answer no one read waits for the
stuck-transition net. The workers' calls are answered by the replica still up: a heartbeat
naming a STARTING attempt moves it to running.

Each case runs the same scripted world without the restart and with one placed inside the
call's flight, and reads the histories."""

from __future__ import annotations

import math

from gpufleet.common.job_lifecycle import EndCause
from gpufleet.common.ledger import FailureClass
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.world import Sim
from tests.support.sim_script import OFFERING, job_moves

CALL_S = 1.0
HEARTBEAT_S = 10.0
TICK_S = 10.0
DEADLINE_S = SchedulerSettings().dispatch_deadline_s


def _script(dead_worker: bool = False) -> Script:
    # One 10-minute clip. With ``dead_worker`` the machine's worker dies 5 s after its first
    # report: still fresh when the job is dispatched, it never runs it and never reports
    # again (the machine is stopped idle, then started again for the job).
    return Script(
        offering=OFFERING,
        workspaces=(("ws", "creator"),),
        jobs=(ScriptedJob(10.0, "ws", "clip", 600.0),),
        call_s=CALL_S,
        worker_deaths=((1, 5.0),) if dead_worker else (),
    )


def _run(script: Script, restart_at: float | None = None, down_s: float = 0.0) -> Sim:
    sim = Sim(SimConfig(days=3 / 24, machines=1, tick_s=TICK_S, script=script))
    if restart_at is not None:
        sim.q.at(restart_at, lambda: sim._outage("restart", down_s))
    sim.run()
    return sim


def _machine_moves(sim: Sim) -> list[tuple[float, str]]:
    assert sim.history is not None
    return [(t, state) for t, what, _, state in sim.history if what == "machine"]


def _first(moves: list[tuple[float, str]], state: str, after: float = 0.0) -> float:
    return next(t for t, s in moves if s == state and t >= after)


def _job(sim: Sim) -> list[tuple[float, str]]:
    (moves,) = job_moves(sim).values()
    return moves


def test_a_create_under_way_is_made_again_by_the_new_leaders_adopt() -> None:
    calm = _machine_moves(_run(_script()))
    asked = _first(calm, "PROVISIONING")
    assert _first(calm, "BOOTING") == asked + CALL_S
    sim = _run(_script(), asked + CALL_S / 2, 60.0)
    moves = _machine_moves(sim)
    back = math.ceil(asked + CALL_S / 2 + 60.0)  # (an outage ends on a whole second)
    # The provider made the instance (it comes up when it would have), but the row moves on
    # only when the adopt's call, made as the new leader ticks, is answered.
    assert _first(moves, "BOOTING") == back + CALL_S
    assert _first(moves, "READY") == _first(calm, "READY")
    assert sim.metrics.decisions["adopt:create"] == 1
    assert len(sim.machines) == 1  # made again, not made twice


def test_a_start_under_way_is_made_again_by_the_new_leaders_adopt() -> None:
    calm = _machine_moves(_run(_script(dead_worker=True)))
    asked = _first(calm, "STARTING")
    sim = _run(_script(dead_worker=True), asked + CALL_S / 2, 30.0)
    moves = _machine_moves(sim)
    assert _first(moves, "BOOTING", asked) == math.ceil(asked + CALL_S / 2 + 30.0) + CALL_S
    assert _first(moves, "READY", asked) == _first(calm, "READY", asked)
    assert sim.metrics.decisions["adopt:start"] == 1


def test_a_dispatch_whose_answer_is_lost_is_moved_to_running_by_the_workers_heartbeat() -> None:
    calm = _run(_script())
    dispatched = _first(_job(calm), "DISPATCHING")
    ran = _first(_job(calm), "RUNNING")
    sim = _run(_script(), dispatched + 1.0, 60.0)
    moves = _job(sim)
    # The agent took it when it would have; the worker's next heartbeat names it (within
    # one heartbeat), long before the restart ends; the job ends when it would have.
    running = _first(moves, "RUNNING")
    assert ran < running <= ran + HEARTBEAT_S
    assert _first(moves, "SUCCEEDED") == _first(_job(calm), "SUCCEEDED")
    assert dict(sim.metrics.attempt_ends) == {EndCause.SUCCEEDED.value: 1}
    assert "adopt:dispatch" not in sim.metrics.decisions


def test_a_dispatch_left_starting_past_its_deadline_is_taken_back_without_a_back_off() -> None:
    calm = _run(_script(dead_worker=True))
    dispatched = _first(_job(calm), "DISPATCHING")
    down_s = DEADLINE_S + 30.0
    sim = _run(_script(dead_worker=True), dispatched + 1.0, down_s)
    moves = _job(sim)
    back = dispatched + 1.0 + down_s
    # No heartbeat names it (the worker is dead) and no process here dispatches it: the new
    # leader's first tick takes it back, its ledger row, no back-off of the machine.
    assert moves[:3] == [(10.0, "QUEUED"), (dispatched, "DISPATCHING"), (back, "QUEUED")]
    assert sim.metrics.attempt_ends[EndCause.TAKEN_BACK.value] == 1
    assert sim.metrics.decisions[f"ledger:{FailureClass.JOB_INFRA_ERROR.value}"] >= 1
    assert sim.machines["m000001"].dispatch_failures == 0


def test_a_dispatch_left_starting_within_its_deadline_is_dispatched_again() -> None:
    calm = _run(_script(dead_worker=True))
    dispatched = _first(_job(calm), "DISPATCHING")
    down_s = DEADLINE_S - 10.0
    sim = _run(_script(dead_worker=True), dispatched + 1.0, down_s)
    moves = _job(sim)
    back = dispatched + 1.0 + down_s
    # The adopt's StartJob is answered (the agent has it): running at its answer; its dead
    # worker renews no lease, which then runs out as before the restart — and is ended by
    # the new leader's tick, on its own grid (its first pass as it came back, then every
    # cadence), the first there after the lease ran out (within a tick of the calm one's).
    assert _first(moves, "RUNNING") == back + sim.cfg.timing.dispatch_s
    assert sim.metrics.decisions["adopt:dispatch"] == 1
    ended, calm_ended = _first(moves, "QUEUED", back), _first(_job(calm), "QUEUED", dispatched)
    assert (ended - back) % TICK_S == 0 and calm_ended % TICK_S == 0
    assert ended != calm_ended and abs(ended - calm_ended) < TICK_S
    assert sim.metrics.attempt_ends[EndCause.WORKER_LOST.value] == 1


def test_a_stop_whose_answer_no_one_read_is_finished_by_the_stuck_transition_net() -> None:
    calm = _machine_moves(_run(_script()))
    stopping = _first(calm, "STOPPING")
    assert _first(calm, "STOPPED") == stopping + CALL_S
    sim = _run(_script(), stopping + CALL_S / 2, 60.0)
    moves = _machine_moves(sim)
    stopped = _first(moves, "STOPPED")
    assert stopped > stopping + CALL_S / 2 + 60.0
    (lost,) = [f for f in sim.failures if f.cls == "answer_lost"]
    assert (lost.at, lost.caught_at, lost.caught_by) == (stopping + CALL_S, stopped, "stuck_transition")
    # No one saw the call fail: no ledger row for it.
    assert f"ledger:{FailureClass.PROVIDER_CALL_FAILED.value}" not in sim.metrics.decisions


def test_after_a_restart_every_loop_runs_on_its_new_processes_grid() -> None:
    """The new processes run each loop at once, then every cadence from then (the services'
    ``Ticker``): a restart that ends off the loops' grid moves them. The idle machine's
    stop is claimed at an auto-stop pass of the new grid, within one cadence of the calm
    month's (its idle timer fell due at the same time)."""
    calm = _machine_moves(_run(_script()))
    stopping = _first(calm, "STOPPING")
    every = Sim(SimConfig(days=1 / 24, machines=1)).every["auto_stop"]
    assert stopping % every == 0
    down_s = 95.0  # ends 5 s past one of the auto-stop's passes
    sim = _run(_script(), stopping - 600.0, down_s)
    back = stopping - 600.0 + down_s
    assert sim.loops["auto_stop"].ceil(back) == back
    moved = _first(_machine_moves(sim), "STOPPING")
    assert (moved - back) % every == 0
    assert moved != stopping and abs(moved - stopping) < every
