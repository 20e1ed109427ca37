"""One real agent (daemon, worker, runners, sample pipeline) serving jobs end to end,
reporting to the test's fake scheduler over real gRPC."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gpufleet.common.errors import FailedPrecondition, InvalidArgument
from gpufleet.common.grpcclient import call
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import agent_service_pb2, agent_service_pb2_grpc, job_pb2
from tests.integration.agent.conftest import (
    CLOCK_SPEED,
    AgentLauncher,
    AgentProcess,
    start_request,
    wait_running,
)
from tests.integration.agent.fake_scheduler import FakeWorkerService, wait_for
from tests.support import tls

SLOTS = 4


@pytest.fixture(scope="module")
def agent(launcher: AgentLauncher, tmp_path_factory: pytest.TempPathFactory) -> AgentProcess:
    return launcher.start(tmp_path_factory.mktemp("machine") / "state", slots=SLOTS)


def completion_of(fake: FakeWorkerService, attempt_id: str) -> object:
    return wait_for(lambda: fake.completion(attempt_id), what=f"completion of {attempt_id}")


def test_probe_describes_the_machine(agent: AgentProcess) -> None:
    with agent.client() as client:
        probe = client.probe()
    assert probe.machine_id == "machine-1"
    assert probe.slots == SLOTS
    assert probe.sampler == "simulated"  # no GPU on this machine
    assert probe.worker_alive
    assert probe.startup_complete
    assert probe.startup_error == ""
    assert probe.agent_version


def test_a_job_runs_is_heartbeated_and_reported_succeeded(
    agent: AgentProcess, fake_scheduler: FakeWorkerService
) -> None:
    started = time.monotonic()
    with agent.client() as client:
        first = client.start_job(start_request("ok-1", slot=1, duration_s=30))
        again = client.start_job(start_request("ok-1", slot=1, duration_s=30))
    assert not first.already_running
    assert again.already_running

    runner = wait_running(agent, "ok-1")
    assert runner.job_id == "job-ok-1" and runner.slot == 1 and runner.pid > 0
    beat = wait_for(
        lambda: [h for h in fake_scheduler.heartbeats_since(started) if "ok-1" in h.running],
        what="a heartbeat naming the attempt",
    )[0]
    assert beat.machine_id == "machine-1"
    assert beat.running["ok-1"] == 1

    done = completion_of(fake_scheduler, "ok-1")
    assert done.outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED
    assert done.exit_code == 0
    assert done.machine_id == "machine-1"
    # 30 clock seconds on one slot, measured on the shared clock (a little more: start-up).
    assert 30 <= done.slot_seconds < 30 + 10 * CLOCK_SPEED
    # Filed away once the completion is acknowledged (just after the scheduler has it).
    filed = agent.state_dir / "finished" / "ok-1" / "job.log"
    wait_for(filed.exists, what="the attempt filed away")
    log = filed.read_text()
    assert "rendering: 100%" in log
    assert all(r.attempt_id != "ok-1" for r in agent.list_runners())
    # Only one runner ever ran it, despite the second StartJob.
    assert len([c for c in fake_scheduler.completion_calls if c.attempt_id == "ok-1"]) == 1


def test_cancel_stops_the_job(agent: AgentProcess, fake_scheduler: FakeWorkerService) -> None:
    with agent.client() as client:
        client.start_job(start_request("cancel-1", slot=0, duration_s=10_000))
        wait_running(agent, "cancel-1")
        job_pid = json.loads((agent.state_dir / "attempts" / "cancel-1" / "runner.json").read_text())[
            "job_pid"
        ]
        assert client.cancel_job("cancel-1", "user asked").was_running
    done = completion_of(fake_scheduler, "cancel-1")
    assert done.outcome == job_pb2.ATTEMPT_STATE_CANCELLED
    assert "user asked" in done.message
    assert (
        not Path(f"/proc/{job_pid}").exists() or "Z" in Path(f"/proc/{job_pid}/stat").read_text().split()[2]
    )
    with agent.client() as client:
        assert not client.cancel_job("cancel-1", "again").was_running  # idempotent


def test_the_control_plane_cancels_through_the_heartbeat(
    agent: AgentProcess, fake_scheduler: FakeWorkerService
) -> None:
    with agent.client() as client:
        client.start_job(start_request("hb-cancel", slot=0, duration_s=10_000))
    wait_running(agent, "hb-cancel")
    with fake_scheduler.lock:
        fake_scheduler.cancel_next.add("hb-cancel")
    done = completion_of(fake_scheduler, "hb-cancel")
    assert done.outcome == job_pb2.ATTEMPT_STATE_CANCELLED


def test_time_limit_times_the_job_out(agent: AgentProcess, fake_scheduler: FakeWorkerService) -> None:
    with agent.client() as client:
        client.start_job(start_request("limit-1", slot=2, slots=2, duration_s=10_000, time_limit_s=20))
    done = completion_of(fake_scheduler, "limit-1")
    assert done.outcome == job_pb2.ATTEMPT_STATE_TIMED_OUT
    # 20 clock seconds on two slots.
    assert 40 <= done.slot_seconds < 40 + 2 * 10 * CLOCK_SPEED


def test_a_failing_job_is_reported_failed_with_its_exit_code(
    agent: AgentProcess, fake_scheduler: FakeWorkerService
) -> None:
    with agent.client() as client:
        client.start_job(start_request("fail-3", slot=3, duration_s=2, exit_code=3))
    done = completion_of(fake_scheduler, "fail-3")
    assert done.outcome == job_pb2.ATTEMPT_STATE_FAILED
    assert done.exit_code == 3


def test_a_completion_is_retried_until_acknowledged(
    agent: AgentProcess, fake_scheduler: FakeWorkerService
) -> None:
    with fake_scheduler.lock:
        fake_scheduler.refuse_completions = 2
    with agent.client() as client:
        client.start_job(start_request("retry-1", slot=0, duration_s=2))
    done = completion_of(fake_scheduler, "retry-1")
    assert done.outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED
    assert len([c for c in fake_scheduler.completion_calls if c.attempt_id == "retry-1"]) == 3


def test_tenant_values_arrive_byte_for_byte_and_nothing_runs(
    agent: AgentProcess, fake_scheduler: FakeWorkerService, tmp_path: Path
) -> None:
    pwned = tmp_path / "pwned"
    payloads = {
        "subshell": f"$(touch {pwned})",
        "chain": f"; rm -rf / ; touch {pwned}",
        "backticks": f"`touch {pwned}`",
        "quotes": f"'\"; touch {pwned}; echo \"'",
        "newline": f"x\ntouch {pwned}\n",
        "glob_and_vars": "* $HOME ${PATH} %s {} \\ \t",
        "unicode": "épisode — 🎬 \u202e",
        f"$(touch {pwned})": "key too",
    }
    with agent.client() as client:
        client.start_job(start_request("inject-1", slot=1, duration_s=1, tenant_values=payloads))
    done = completion_of(fake_scheduler, "inject-1")
    assert done.outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED
    log = (agent.state_dir / "finished" / "inject-1" / "job.log").read_text()
    echoed = next(line for line in log.splitlines() if line.startswith("tenant_values "))
    received = json.loads(echoed.removeprefix("tenant_values "))
    assert received == {"duration_s": "1", "exit_code": "0", **payloads}
    assert not pwned.exists()


def test_bad_requests_name_the_field(agent: AgentProcess) -> None:
    cases = [
        (start_request("x", slot=SLOTS), "slot"),
        (start_request("x", slot=-1), "slot"),
        (start_request("x", slot=3, slots=2), "slots"),
        (start_request(""), "attempt_id"),
        (start_request("../../etc"), "attempt_id"),
    ]
    no_job = start_request("no-job")
    no_job.job_id = ""
    cases.append((no_job, "job_id"))
    with agent.client() as client:
        for request, field in cases:
            with pytest.raises(InvalidArgument) as caught:
                client.start_job(request)
            assert caught.value.field == field, request


def test_start_up_failure_is_reported_and_refuses_jobs(agent: AgentProcess) -> None:
    error_file = agent.state_dir / "startup.error"
    error_file.write_text("pipeline v7 failed to install\n")
    try:
        with agent.client() as client:
            probe = client.probe()
            assert not probe.startup_complete
            assert probe.startup_error == "pipeline v7 failed to install"
            with pytest.raises(FailedPrecondition):
                client.start_job(start_request("refused-1", slot=0))
    finally:
        error_file.unlink()
    with agent.client() as client:
        assert client.probe().startup_complete


def test_samples_report_activity_and_requests(agent: AgentProcess, fake_scheduler: FakeWorkerService) -> None:
    with agent.client() as client:
        client.sample()  # reset the request counter
        idle = client.sample()
        assert idle.sampler == "simulated"
        assert idle.requests_since_last_sample == 0
        assert idle.running_attempts == 0
        assert idle.gpu_utilization_percent == 0
        client.start_job(start_request("busy-1", slot=0, duration_s=10_000))
        client.cancel_job("never-started", "noise")
        busy = client.sample()
        assert busy.requests_since_last_sample == 2
        assert busy.running_attempts == 1
        assert 50 < busy.gpu_utilization_percent <= 100
        assert busy.HasField("sample_time")
        assert client.cancel_job("busy-1", "done with it").was_running
    assert completion_of(fake_scheduler, "busy-1").outcome == job_pb2.ATTEMPT_STATE_CANCELLED
    bad = agent_service_pb2.SampleUtilizationRequest()
    bad.window.FromSeconds(-1)
    with (
        tls.channel(agent.address, Role.MACHINE, who="reaper", machine_id=agent.machine_id) as channel,
        pytest.raises(InvalidArgument) as caught,
    ):
        call(
            agent_service_pb2_grpc.AgentServiceStub(channel).SampleUtilization,
            bad,
            timeout=5,
            idempotent=False,
        )
    assert caught.value.field == "window"
