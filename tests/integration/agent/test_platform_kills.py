"""Whose kill ended a job, told apart on a real walled agent.

The job's own death — ``kill -9 $$``, a non-zero exit, the kernel killing it at its memory
limit — is reported FAILED, its own (the scheduler charges it and spends a retry). A kill
the platform made while the job ran — here the wipe of the slot it runs in, as opening the
slot for another attempt does — is reported INFRA_ERROR with the platform's reason: the
wipe wrote down whom it killed before it killed them.
"""

from __future__ import annotations

import json

import pytest

from gpufleet.agent.settings import Settings
from gpufleet.agent.walls.launcher import clean_slot
from gpufleet.agent.walls.setup import walls_config
from gpufleet.agent.walls.wipe import processes_of
from gpufleet.v1 import job_pb2
from tests.integration.agent.conftest import AgentLauncher, AgentProcess, start_request, wait_running
from tests.integration.agent.fake_scheduler import FakeWorkerService, wait_for

# The job, by its tenant values: how it ends. Run by the system's Python as the slot's user.
JOB = r"""
import json, os, sys, time
values = json.load(open(os.environ["GPUFLEET_JOB_SPEC"]))["tenant_values"]
end = values.get("end", "exit")
if end == "kill-self":
    os.execv("/bin/sh", ["sh", "-c", "kill -9 $$"])
if end == "balloon":
    hoard = []
    while True:
        hoard.append(b"x" * (16 << 20))
if end == "sleep":
    time.sleep(float(values.get("seconds", "600")))
sys.exit(int(values.get("code", "0")))
"""


@pytest.fixture(scope="module")
def ending(launcher: AgentLauncher, tmp_path_factory: pytest.TempPathFactory) -> AgentProcess:
    state = tmp_path_factory.mktemp("ending") / "state"
    state.mkdir()
    return launcher.start(
        state,
        slots=2,
        machine_id="ending-1",
        extra_env={"GPUFLEET_PIPELINE_COMMAND": json.dumps(["python3", "-I", "-c", JOB])},
    )


def run(agent: AgentProcess, fake: FakeWorkerService, attempt_id: str, **values: str) -> object:
    request = start_request(attempt_id, tenant_values=values)
    if values.get("end") == "balloon":
        request.memory_limit_bytes = 64 << 20
    with agent.client() as client:
        client.start_job(request)
    return wait_for(lambda: fake.completion(attempt_id), timeout=60, what=f"completion of {attempt_id}")


def test_a_job_that_kills_itself_fails_on_its_own_account(
    ending: AgentProcess, fake_scheduler: FakeWorkerService
) -> None:
    result = run(ending, fake_scheduler, "own-kill-1", end="kill-self")
    assert result.outcome == job_pb2.ATTEMPT_STATE_FAILED  # type: ignore[attr-defined]
    assert result.exit_code == 137  # type: ignore[attr-defined]
    assert result.message == "the job was killed by SIGKILL"  # type: ignore[attr-defined]


def test_a_job_that_exits_non_zero_fails_on_its_own_account(
    ending: AgentProcess, fake_scheduler: FakeWorkerService
) -> None:
    result = run(ending, fake_scheduler, "own-exit-1", code="3")
    assert (result.outcome, result.exit_code) == (job_pb2.ATTEMPT_STATE_FAILED, 3)  # type: ignore[attr-defined]


def test_a_job_killed_at_its_memory_limit_fails_on_its_own_account(
    ending: AgentProcess, fake_scheduler: FakeWorkerService
) -> None:
    result = run(ending, fake_scheduler, "own-oom-1", end="balloon")
    assert (result.outcome, result.exit_code) == (job_pb2.ATTEMPT_STATE_FAILED, 137)  # type: ignore[attr-defined]
    assert "at its memory limit (out of memory)" in result.message  # type: ignore[attr-defined]


def test_a_job_the_wipe_of_its_slot_kills_is_the_platforms(
    ending: AgentProcess, fake_scheduler: FakeWorkerService
) -> None:
    with ending.client() as client:
        client.start_job(start_request("wiped-1", slot=1, tenant_values={"end": "sleep"}))
    wait_running(ending, "wiped-1")
    # The agent's own wipe of slot 1, as opening it for another attempt runs it.
    settings = Settings(
        machine_id=ending.machine_id,
        agent_state_dir=ending.state_dir,
        walls_name=ending.names.walls_name,
        slots=2,
    )
    config = walls_config(settings)
    user = config.user(1)
    wait_for(lambda: processes_of(user.uid), what="the job running as slot 1's user")
    clean_slot(config, user, acting_for="intruder-1")
    result = wait_for(lambda: fake_scheduler.completion("wiped-1"), what="completion of wiped-1")
    assert result.outcome == job_pb2.ATTEMPT_STATE_INFRA_ERROR  # type: ignore[attr-defined]
    assert result.exit_code == 137  # type: ignore[attr-defined]
    assert "killed by the platform (slot 1 wiped for attempt intruder-1)" in result.message  # type: ignore[attr-defined]
