"""A job that waits past its kind's queue-wait deadline fails, uncharged, as the scheduler's
queue-wait timeout fails it (``queue_wait.decide`` at the first pass of its grid that finds
the wait strictly past the deadline: QUEUED to FAILED by the request watchdog, one ledger
row) — in the month that runs each pass only for the jobs it is due for, and in the month
that reads the whole queue at every pass, alike."""

from __future__ import annotations

from gpufleet.common.ledger import FailureClass
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.world import KINDS, Sim
from tests.support.sim_script import OFFERING

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


def test_the_month_that_reads_the_whole_queue_at_every_pass_is_the_same() -> None:
    _, due_only = _run(False)
    _, every_pass = _run(True)
    assert [h for h in due_only if h[1] == "job"] == [h for h in every_pass if h[1] == "job"]
