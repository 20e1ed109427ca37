"""An attempt the control plane ends keeps its slot held until the machine's worker
reports its process gone (``EndRule.holds_slot``), as the scheduler's snapshot reads
``attempts.holds_slot``: a job waiting for that slot is placed at the first tick after the
worker's next heartbeat, not at the first tick after the end. The worker's own report of
an end frees the slot at once."""

from __future__ import annotations

import math

from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.world import KINDS, Sim
from tests.support.sim_script import OFFERING, job_moves

LIMIT_S = KINDS["clip"].time_limit_s
TICK_S = 2.0  # well under the 10 s heartbeat: the wait for it shows


def _run(jobs: tuple[ScriptedJob, ...]) -> tuple[Sim, dict[str, list[tuple[float, str]]]]:
    script = Script(offering=OFFERING, workspaces=(("ws", "studio"),), jobs=jobs)
    # One machine (the fleet's ceiling): the waiting job can only take a freed slot.
    sim = Sim(SimConfig(days=(LIMIT_S + 1800.0) / 86400.0, machines=1, tick_s=TICK_S, script=script))
    sim.run()
    return sim, job_moves(sim)


def _at(moves: list[tuple[float, str]], state: str) -> float:
    return next(t for t, s in moves if s == state)


def test_a_timed_out_attempts_slot_is_free_only_after_the_workers_next_heartbeat() -> None:
    # Two clips past their kind's limit fill the machine; a third waits for a slot.
    sim, moves = _run(
        (
            ScriptedJob(10.0, "ws", "clip", LIMIT_S + 1200.0),
            ScriptedJob(10.0, "ws", "clip", LIMIT_S + 1200.0),
            ScriptedJob(600.0, "ws", "clip", 60.0),
        )
    )
    first, second, waiting = sorted(moves)
    ended = _at(moves[first], "TIMED_OUT")
    assert _at(moves[second], "TIMED_OUT") == ended
    (m,) = sim.machines.values()
    beat = (
        m.startup_done_at + (math.floor((ended - m.startup_done_at) / sim.heartbeat_s) + 1) * sim.heartbeat_s
    )
    placed = _at(moves[waiting], "DISPATCHING")
    assert ended < beat <= placed < beat + TICK_S + 1e-6
    assert placed - ended > TICK_S  # the slot was not free at the first tick after the end
    assert sim.metrics.attempt_ends["time_limit"] == 2
    assert not m.held  # the heartbeat let go of both


def test_a_slot_the_worker_reports_free_is_taken_at_the_next_tick() -> None:
    _, moves = _run(
        (
            ScriptedJob(10.0, "ws", "clip", 1200.0),
            ScriptedJob(10.0, "ws", "clip", 1200.0),
            ScriptedJob(600.0, "ws", "clip", 60.0),
        )
    )
    first, _, waiting = sorted(moves)
    ended = _at(moves[first], "SUCCEEDED")
    placed = _at(moves[waiting], "DISPATCHING")
    assert ended <= placed <= ended + TICK_S
