"""A lease is a fence on the machine too (#27): real agents, workers, runners and jobs
behind their walls, against the test's WorkerService, which keeps the scheduler's books on
each attempt's lease (a heartbeat renews it for ``lease_s`` of the clock from when it was
received). Three ways the renewals stop — the worker killed, the path to the scheduler
cut, the worker paused — and in each the first attempt's job must be gone before its
lease runs out; the test then plays the scheduler's retry at the earliest instant it could
come (the lease's end) on a second machine, and reads the kernel's own record of both
jobs' processes: at no instant do two attempts of the job run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from gpufleet.agent.specs import AttemptResult, Outcome
from gpufleet.common.clients.agent import AgentClient
from gpufleet.common.errors import GpufleetError
from gpufleet.v1 import job_pb2
from tests.integration.agent.conftest import (
    CLOCK_SPEED,
    AgentLauncher,
    AgentProcess,
    start_request,
    wait_running,
)
from tests.integration.agent.fake_scheduler import FakeWorkerService, wait_for
from tests.integration.agent.partition import PartitionablePath
from tests.support import tls
from tests.support.job_lifetimes import JobWatch, monotonic_to_boot

# Clock seconds (3 s of real time at the tests' speed): the fence falls at half of it.
LEASE_S = 60.0
LEASE_ENV = {"GPUFLEET_ASSUMED_LEASE_S": str(LEASE_S)}


@pytest.fixture(scope="module", autouse=True)
def short_leases(fake_scheduler: FakeWorkerService) -> None:
    fake_scheduler.lease_s = LEASE_S
    fake_scheduler.clock_speed = CLOCK_SPEED


@pytest.fixture
def watch() -> Iterator[JobWatch]:
    jobs = JobWatch()
    yield jobs
    jobs.close()


def _run_the_fault(
    launcher: AgentLauncher,
    fake: FakeWorkerService,
    watch: JobWatch,
    tmp_path: Path,
    name: str,
    fault: Callable[[AgentProcess], None],
    agent_env: dict[str, str] | None = None,
) -> AgentProcess:
    """Attempt 1 of job ``name`` on machine A, the fault, then the earliest retry on B."""
    machine_a = launcher.start(
        tmp_path / "a", machine_id=f"{name}-a", slots=1, extra_env={**LEASE_ENV, **(agent_env or {})}
    )
    machine_b = launcher.start(tmp_path / "b", machine_id=f"{name}-b", slots=1, extra_env=LEASE_ENV)
    first, retry = f"{name}-1", f"{name}-2"
    fake.grant(first, time.monotonic())  # dispatch: the scheduler's lease starts before StartJob
    with machine_a.client() as client:
        request = start_request(first, duration_s=10_000)
        request.job_id = f"job-{name}"
        client.start_job(request)
    wait_running(machine_a, first)
    watch.track(first, machine_a.state_dir / "attempts" / first)
    wait_for(
        lambda: any(first in h.running for h in fake.heartbeats_since(time.monotonic() - 0.5)),
        what="a heartbeat that renews the first attempt",
    )

    fault(machine_a)

    # The scheduler's lease of the first attempt runs out: from here it may run it elsewhere.
    lease_end = fake.lease_end(first)
    time.sleep(max(0.0, lease_end - time.monotonic()))
    assert fake.lease_end(first) == lease_end  # nobody renewed it meanwhile
    gone = watch.gone_at(first)
    assert gone is not None, "the first attempt's job outlived its lease"
    assert gone < monotonic_to_boot(lease_end)

    with machine_b.client() as client:
        request = start_request(retry, duration_s=20)
        request.job_id = f"job-{name}"
        client.start_job(request)
    wait_running(machine_b, retry)
    watch.track(retry, machine_b.state_dir / "attempts" / retry)
    # The kernel's start time of the retry's job against the first look that found the
    # first attempt's job gone: never both at once.
    assert gone <= watch.lives[retry].started
    return machine_a


def _verdict(agent: AgentProcess, attempt_id: str) -> AttemptResult:
    def written() -> AttemptResult | None:
        for folder in ("attempts", "finished"):
            result = AttemptResult.load(agent.state_dir / folder / attempt_id / "result.json")
            if result is not None:
                return result
        return None

    return wait_for(written, what=f"the verdict of {attempt_id}")


def test_a_killed_worker_leaves_no_job_running_past_its_lease(
    launcher: AgentLauncher, fake_scheduler: FakeWorkerService, watch: JobWatch, tmp_path: Path
) -> None:
    def kill_the_worker(agent: AgentProcess) -> None:
        os.kill(agent.worker_pid(), signal.SIGKILL)

    machine_a = _run_the_fault(launcher, fake_scheduler, watch, tmp_path, "killed", kill_the_worker)
    result = _verdict(machine_a, "killed-1")
    assert result.outcome is Outcome.INFRA_ERROR
    assert "lease fence" in result.message


def test_a_cut_path_leaves_no_job_running_past_its_lease(
    launcher: AgentLauncher, fake_scheduler: FakeWorkerService, watch: JobWatch, tmp_path: Path
) -> None:
    scheduler_address = f"127.0.0.1:{launcher.scheduler_port}"
    path = PartitionablePath(scheduler_address)
    try:
        machine_a = _run_the_fault(
            launcher,
            fake_scheduler,
            watch,
            tmp_path,
            "cut",
            lambda agent: path.cut(),
            agent_env={"GPUFLEET_SCHEDULER_ADDRESS": path.address, "GPUFLEET_RPC_TIMEOUT_S": "1"},
        )
        assert machine_a.proc.poll() is None and machine_a.client().probe().worker_alive
        path.heal()
        # The worker, which never stopped, reports the fenced attempt as ours once it can.
        done = wait_for(lambda: fake_scheduler.completion("cut-1"), what="the fenced attempt's report")
        assert done.outcome == job_pb2.ATTEMPT_STATE_INFRA_ERROR
        assert "lease fence" in done.message
    finally:
        path.close()


def test_a_paused_worker_leaves_no_job_running_past_its_lease(
    launcher: AgentLauncher, fake_scheduler: FakeWorkerService, watch: JobWatch, tmp_path: Path
) -> None:
    paused: list[int] = []

    def pause_the_worker(agent: AgentProcess) -> None:
        paused.append(agent.worker_pid())
        os.kill(paused[0], signal.SIGSTOP)

    try:
        _run_the_fault(launcher, fake_scheduler, watch, tmp_path, "paused", pause_the_worker)
    finally:
        for pid in paused:
            os.kill(pid, signal.SIGCONT)
    done = wait_for(lambda: fake_scheduler.completion("paused-1"), what="the fenced attempt's report")
    assert done.outcome == job_pb2.ATTEMPT_STATE_INFRA_ERROR
    assert "lease fence" in done.message


def test_a_start_the_scheduler_gave_up_on_is_never_launched(
    launcher: AgentLauncher, fake_scheduler: FakeWorkerService, tmp_path: Path
) -> None:
    """A frozen agent that thaws after the scheduler's StartJob call timed out must not
    start the attempt: the scheduler takes it back and may already run the job elsewhere.
    (gRPC drops a call whose deadline passed before its handler ran; this keeps it so.)"""
    agent = launcher.start(tmp_path / "state", machine_id="thawed", slots=1, extra_env=LEASE_ENV)
    client = AgentClient(agent.machine_id, agent.address, tls.transport("scheduler"), timeout_s=1.0)
    client.probe()  # the channel is up before the agent freezes
    os.kill(agent.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(GpufleetError) as refused:
            client.start_job(start_request("given-up", duration_s=10_000))
        assert getattr(refused.value, "grpc_code", None) == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        os.kill(agent.proc.pid, signal.SIGCONT)
    assert client.probe().worker_alive  # the agent answers again
    time.sleep(1.0)  # ample for a delivered spec to be launched (the worker polls every 0.05 s)
    assert not agent.state_dir.joinpath("attempts", "given-up").exists()
    assert not agent.state_dir.joinpath("inbox", "given-up.json").exists()
    client.close()


# A scheduler process that sends one StartJob (a 1 s deadline) when told to, on a channel
# it opened while the agent still ran, and reports how the call ended.
_LATE_CANCELLER = """
import sys, grpc
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import agent_service_pb2_grpc
from tests.integration.agent.conftest import start_request
from tests.support import tls
address, machine_id = sys.argv[1:3]
with tls.channel(address, Role.MACHINE, who="scheduler", machine_id=machine_id) as channel:
    stub = agent_service_pb2_grpc.AgentServiceStub(channel)
    stub.Probe(__import__("gpufleet.v1.agent_service_pb2", fromlist=["x"]).ProbeRequest(), timeout=5)
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        stub.StartJob(start_request("cancel-late", duration_s=10_000), timeout=1.0)
        print("answered", flush=True)
    except grpc.RpcError as err:
        print(err.code().name, flush=True)
"""


def test_a_start_read_after_a_pause_is_refused_though_its_callers_cancel_comes_later(
    launcher: AgentLauncher, fake_scheduler: FakeWorkerService, tmp_path: Path
) -> None:
    """The race gRPC alone loses: the caller gave up, but its cancel has not reached the agent
    when the agent thaws and reads the call (here the caller froze too, before its deadline's
    cancel went out). The agent knows it was paused longer than the call's deadline and
    refuses; without that it would launch a start the scheduler took back."""
    agent = launcher.start(tmp_path / "state", machine_id="thawed-2", slots=1, extra_env=LEASE_ENV)
    caller = subprocess.Popen(
        [sys.executable, "-c", _LATE_CANCELLER, agent.address, agent.machine_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert caller.stdin is not None and caller.stdout is not None
    try:
        assert caller.stdout.readline().strip() == "ready"
        os.kill(agent.proc.pid, signal.SIGSTOP)
        caller.stdin.write("go\n")
        caller.stdin.flush()
        time.sleep(0.5)  # the call is on the wire, half its deadline gone
        os.kill(caller.pid, signal.SIGSTOP)  # its cancel, due at 1 s, will go out late
        time.sleep(1.5)
        os.kill(agent.proc.pid, signal.SIGCONT)
        time.sleep(1.0)  # the agent reads the call and decides, the caller still frozen
        assert not agent.state_dir.joinpath("attempts", "cancel-late").exists()
        assert not agent.state_dir.joinpath("inbox", "cancel-late.json").exists()
    finally:
        os.kill(agent.proc.pid, signal.SIGCONT)
        os.kill(caller.pid, signal.SIGCONT)
    caller.stdin.close()
    assert caller.stdout.readline().strip() == "DEADLINE_EXCEEDED"
    assert caller.wait(timeout=10) == 0
    assert agent.client().probe().worker_alive
