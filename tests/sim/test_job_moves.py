"""Every job and attempt move the simulator makes is held to the job lifecycle's tables
(``check_cause``, ``check_attempt_move``, ``check_job_move``) for the service that makes it,
as the services' one writer holds theirs: a move the tables refuse breaks the month."""

from __future__ import annotations

import pytest

from gpufleet.common.job_lifecycle import EndCause, JobUpdate, Mover
from gpufleet.sim.profile import Script, ScriptedJob, SimConfig
from gpufleet.sim.records import Attempt
from gpufleet.sim.world import InvariantBroken, Sim
from tests.support.sim_script import OFFERING

SCRIPT = Script(
    offering=OFFERING, workspaces=(("ws", "creator"),), jobs=(ScriptedJob(10.0, "ws", "clip", 300.0),)
)


def _month(sim_class: type[Sim]) -> Sim:
    sim = sim_class(SimConfig(days=1 / 24, machines=2, tick_s=10.0, script=SCRIPT))
    sim.run()
    return sim


def test_a_month_of_moves_the_tables_allow_runs() -> None:
    sim = _month(Sim)
    assert sim.metrics.attempt_ends[EndCause.SUCCEEDED.value] == 1


class CompletionByTheWrongService(Sim):
    """A completion ended as if the fleet tick's limits step had ended it."""

    def _end_attempt(
        self, a: Attempt, cause: EndCause, by: Mover, measured_slot_s: float | None = None
    ) -> JobUpdate:
        return super()._end_attempt(a, cause, Mover.LIMITS if by is Mover.WORKER else by, measured_slot_s)


def test_a_move_by_a_service_the_tables_do_not_allow_breaks_the_month() -> None:
    with pytest.raises(InvariantBroken, match="limits may not end an attempt as succeeded"):
        _month(CompletionByTheWrongService)


def test_each_end_the_worker_reports_writes_its_ledger_row_as_reportcompletion_does() -> None:
    # Half a drawn day: some tenants' jobs fail on their own (the runner's ``job_failed`` row).
    sim = Sim(SimConfig(days=0.5, machines=60, seed=5))
    sim.run()
    failed = sim.metrics.attempt_ends[EndCause.JOB_FAILED.value]
    assert failed > 0
    assert sim.metrics.decisions["ledger:job_failed"] == failed
    assert "ledger:succeeded" not in sim.metrics.decisions  # a success writes no row
