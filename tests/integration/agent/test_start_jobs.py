"""StartJobs on a real agent: the fleet tick's one call per machine. Each attempt is decided
as StartJob would decide it — a refused one answers for itself and the others still start —
and a repeat is idempotent by attempt id."""

from __future__ import annotations

import grpc
import pytest

from gpufleet.common.errors import InvalidArgument
from tests.integration.agent.conftest import AgentLauncher, AgentProcess, start_request, wait_running
from tests.integration.agent.fake_scheduler import FakeWorkerService


@pytest.fixture(scope="module")
def agent(launcher: AgentLauncher, tmp_path_factory: pytest.TempPathFactory) -> AgentProcess:
    return launcher.start(tmp_path_factory.mktemp("batch") / "state", slots=2, machine_id="machine-b")


def test_each_attempt_of_a_call_is_answered_on_its_own(
    agent: AgentProcess, fake_scheduler: FakeWorkerService
) -> None:
    first = start_request("batch-1", slot=0, duration_s=10_000)
    clash = start_request("batch-2", slot=0, duration_s=10_000)  # the same slot, after batch-1
    bad = start_request("batch-3", slot=7)  # no such slot on a two-slot machine
    second = start_request("batch-4", slot=1, duration_s=10_000)
    with agent.client() as client:
        results = client.start_jobs([first, clash, bad, second])
        assert [r.attempt_id for r in results] == ["batch-1", "batch-2", "batch-3", "batch-4"]
        codes = [grpc.StatusCode.OK.value[0]] * 4
        codes[1] = grpc.StatusCode.FAILED_PRECONDITION.value[0]
        codes[2] = grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert [r.code for r in results] == codes
        assert "held by attempt batch-1" in results[1].message
        assert "slot" in results[2].message
        assert [r.already_running for r in results] == [False] * 4
        wait_running(agent, "batch-1")
        wait_running(agent, "batch-4")

        # Sent again (a re-dispatch after a lost answer): already running, nothing twice.
        again = client.start_jobs([first, second])
        assert [(r.code, r.already_running) for r in again] == [(0, True), (0, True)]
        assert sorted(r.attempt_id for r in agent.list_runners()) == ["batch-1", "batch-4"]
        for attempt_id in ("batch-1", "batch-4"):
            assert client.cancel_job(attempt_id, "test over").was_running


def test_a_call_with_more_attempts_than_any_machine_has_slots_is_refused_by_field(
    agent: AgentProcess,
) -> None:
    with agent.client() as client, pytest.raises(InvalidArgument) as refused:
        client.start_jobs([start_request(f"many-{i}", slot=0) for i in range(65)])
    assert refused.value.field == "jobs"
