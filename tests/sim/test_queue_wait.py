"""The scheduler's request watchdogs over waiting jobs, as the simulator runs them:

- a job that waits past its kind's queue-wait deadline fails, uncharged, as the queue-wait
  timeout fails it (``queue_wait.decide`` at the first pass of its grid that finds the wait
  strictly past the deadline: QUEUED to FAILED by the request watchdog, one ledger row);
- a job of a paid plan that has waited longer than ``paid_wait_after_s`` opens one paid-wait
  incident (``paid_wait.decide``), once per job;

in the month that runs each pass only for the jobs it is due for, and in the month that
reads the whole queue at every pass, alike."""

from __future__ import annotations

import math

from gpufleet.common.ledger import FailureClass
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.world import KINDS, Sim
from tests.support.sim_script import OFFERING, job_moves

DEADLINE_S = KINDS["clip"].queue_wait_deadline_s
RUN_S = 3000.0  # under the clip's time limit
# One machine (the fleet's ceiling), two slots: 60 clips of 3000 s take 25 hours.
SCRIPT = Script(
    offering=OFFERING,
    workspaces=(("ws", "studio"),),
    jobs=tuple(ScriptedJob(10.0 + i, "ws", "clip", RUN_S) for i in range(60)),
)


def _run(evaluate_everything: bool) -> tuple[Sim, list[tuple[float, str, str, str]]]:
    sim = Sim(
        SimConfig(days=30 / 24, machines=1, tick_s=10.0, script=SCRIPT),
        evaluate_everything=evaluate_everything,
    )
    sim.run()
    assert sim.history is not None
    return sim, sim.history


def test_a_job_waiting_past_its_deadline_fails_at_the_first_pass_past_it() -> None:
    sim, history = _run(False)
    every = SchedulerSettings().queue_wait_every_s
    failed = [(t, ident) for t, what, ident, state in history if what == "job" and state == "FAILED"]
    assert failed and sim.metrics.queue_wait_timeouts == len(failed)
    assert sim.metrics.decisions[f"ledger:{FailureClass.QUEUE_WAIT_TIMEOUT.value}"] == len(failed)
    for t, ident in failed:
        job = sim.jobs[ident]
        assert job.first_start is None  # never ran: nothing charged
        assert job.created + DEADLINE_S < t <= job.created + DEADLINE_S + every
        assert t % every == 0  # on the watchdog's grid
    # Every job either ran to its end or failed waiting: none is left behind.
    ended = {ident for _, what, ident, state in history if what == "job" and state == "SUCCEEDED"}
    assert len(ended) + len(failed) == len(SCRIPT.jobs)


def test_a_job_that_waited_past_the_paid_wait_threshold_opens_one_incident() -> None:
    sim, _ = _run(False)
    settings = SchedulerSettings()
    every, after = settings.paid_wait_every_s, settings.paid_wait_after_s
    moves = job_moves(sim)
    # The first pass strictly after the threshold, while the job still waited (a pass runs
    # before the tick of the same instant): one row per such job.
    expected = 0
    for states in moves.values():
        since = states[0][0]
        left = next((t for t, s in states[1:] if s != "QUEUED"), sim.end)
        expected += (math.floor((since + after) / every) + 1) * every <= left
    assert 0 < expected < len(moves)  # the first jobs ran at once
    assert sim.metrics.decisions[f"ledger:{FailureClass.PAID_WAIT.value}"] == expected


def test_the_month_that_reads_the_whole_queue_at_every_pass_is_the_same() -> None:
    due_only_sim, due_only = _run(False)
    every_pass_sim, every_pass = _run(True)
    assert [h for h in due_only if h[1] == "job"] == [h for h in every_pass if h[1] == "job"]
    rows = (f"ledger:{FailureClass.PAID_WAIT.value}", f"ledger:{FailureClass.QUEUE_WAIT_TIMEOUT.value}")
    assert [due_only_sim.metrics.decisions[r] for r in rows] == [
        every_pass_sim.metrics.decisions[r] for r in rows
    ]
