"""Real agent processes against the test's fake scheduler, on 127.0.0.1.

Each agent is started in a session of its own, as the provisioner's local driver does,
so its worker, runners and jobs share its process group; teardown kills every group this
module started, by its id, and gives back the slot users and walls each agent took. Each
agent gets a walls name of this test run's own, so test runs side by side (and a
`gpufleet up` beside them) never wipe each other's slots.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.agent.settings import Settings
from gpufleet.common import host_release
from gpufleet.common.clients.agent import AgentClient
from gpufleet.common.grpcserver import ServiceServer
from gpufleet.common.host_names import HostNames
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import agent_service_pb2, agent_service_pb2_grpc
from tests.integration.agent.fake_scheduler import FakeWorkerService, start_fake_scheduler, wait_for
from tests.support import tls

# Clock seconds per real second: a 20 s "render" takes one real second.
CLOCK_SPEED = 20.0
HEARTBEAT_S = 4.0  # clock seconds: a heartbeat every 0.2 s of real time


@dataclass
class AgentProcess:
    proc: subprocess.Popen[bytes]
    state_dir: Path
    port: int
    machine_id: str
    names: HostNames  # its slot users, walls and jobs' cgroup on this host

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self) -> AgentClient:
        return AgentClient(self.machine_id, self.address, tls.transport("scheduler"))

    def list_runners(self) -> list[agent_service_pb2.Runner]:
        with tls.channel(self.address, Role.MACHINE, who="scheduler", machine_id=self.machine_id) as channel:
            stub = agent_service_pb2_grpc.AgentServiceStub(channel)
            return list(stub.ListRunners(agent_service_pb2.ListRunnersRequest(), timeout=5).runners)

    def worker_pid(self) -> int:
        return int((self.state_dir / "worker.pid").read_text())

    def kill(self) -> None:
        """kill -9 the daemon alone (its worker and runners are untouched)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


class AgentLauncher:
    """Starts agents for one test module; remembers every process group to clean up."""

    def __init__(self, scheduler_port: int, clock_origin: float) -> None:
        self.scheduler_port = scheduler_port
        self.clock_origin = clock_origin
        self.groups: list[int] = []
        self.names: list[HostNames] = []
        self.run_tag = secrets.token_hex(3)

    def next_walls_name(self) -> str:
        return f"t{self.run_tag}-{len(self.names)}"

    def start(
        self,
        state_dir: Path,
        *,
        slots: int = 4,
        machine_id: str = "machine-1",
        extra_env: dict[str, str] | None = None,
        walls_name: str | None = "",
    ) -> AgentProcess:
        """``walls_name``: "" for one of this run's own, None for the agent's default (its
        deployment's, machine's and state folder's)."""
        env = {
            **os.environ,
            "GPUFLEET_WALLS_NAME": self.next_walls_name() if walls_name == "" else (walls_name or ""),
            "GPUFLEET_MACHINE_ID": machine_id,
            "GPUFLEET_AGENT_STATE_DIR": str(state_dir),
            "GPUFLEET_SCHEDULER_ADDRESS": f"127.0.0.1:{self.scheduler_port}",
            "GPUFLEET_LISTEN_ADDRESS": "127.0.0.1:0",
            "GPUFLEET_SLOTS": str(slots),
            "GPUFLEET_CLOCK": "scaled",
            "GPUFLEET_CLOCK_SPEED": str(CLOCK_SPEED),
            "GPUFLEET_CLOCK_ORIGIN": repr(self.clock_origin),
            "GPUFLEET_HEARTBEAT_S": str(HEARTBEAT_S),
            "GPUFLEET_POLL_S": "0.05",
            "GPUFLEET_KILL_GRACE_S": "2",
            "GPUFLEET_LOG_FORMAT": "text",
            **tls.env(f"machine:{machine_id}"),
            **(extra_env or {}),
        }
        names = Settings(
            machine_id=machine_id,
            agent_state_dir=state_dir,
            deployment_id=env.get("GPUFLEET_DEPLOYMENT_ID", "local"),
            walls_name=env["GPUFLEET_WALLS_NAME"],
        ).host_names
        self.names.append(names)
        port_file = state_dir / "agent.port"
        port_file.unlink(missing_ok=True)
        log = open(state_dir.parent / f"{state_dir.name}-agent.log", "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufleet.agent"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.groups.append(proc.pid)

        def ready() -> int | None:
            if proc.poll() is not None:
                raise AssertionError(f"agent exited with {proc.returncode}")
            pid_file = state_dir / "agent.pid"
            if port_file.exists() and pid_file.exists() and int(pid_file.read_text()) == proc.pid:
                return int(port_file.read_text())
            return None

        port = wait_for(ready, timeout=20, what="agent.port")
        return AgentProcess(proc, state_dir, port, machine_id, names)

    def kill_all(self) -> None:
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        for names in self.names:
            assert host_release.release(names) == [], f"{names} not given back"


@pytest.fixture(scope="module")
def scheduler() -> Iterator[tuple[FakeWorkerService, ServiceServer]]:
    fake, server = start_fake_scheduler()
    yield fake, server
    server.stop(0)


@pytest.fixture(scope="module")
def fake_scheduler(scheduler: tuple[FakeWorkerService, ServiceServer]) -> FakeWorkerService:
    return scheduler[0]


@pytest.fixture(scope="module")
def launcher(scheduler: tuple[FakeWorkerService, ServiceServer]) -> Iterator[AgentLauncher]:
    agents = AgentLauncher(scheduler[1].port, time.time())
    yield agents
    agents.kill_all()


def start_request(
    attempt_id: str,
    *,
    slot: int = 0,
    slots: int = 1,
    duration_s: float = 20,
    exit_code: int = 0,
    time_limit_s: float = 0,
    tenant_values: dict[str, str] | None = None,
) -> agent_service_pb2.AgentServiceStartJobRequest:
    values = {"duration_s": str(duration_s), "exit_code": str(exit_code), **(tenant_values or {})}
    request = agent_service_pb2.AgentServiceStartJobRequest(
        request_id=f"req-{attempt_id}",
        attempt_id=attempt_id,
        job_id=f"job-{attempt_id}",
        slot=slot,
        slots=slots,
        kind="short_episode",
        pipeline_version="v1",
        workspace="ws-1",
        tenant_values=values,
    )
    if time_limit_s:
        request.time_limit.FromSeconds(int(time_limit_s))
    return request


def wait_running(agent: AgentProcess, attempt_id: str) -> agent_service_pb2.Runner:
    """Until ListRunners shows the attempt with its job started (runner.json written)."""

    def shown() -> agent_service_pb2.Runner | None:
        for runner in agent.list_runners():
            if runner.attempt_id == attempt_id and runner.pid and runner.HasField("start_time"):
                return runner
        return None

    return wait_for(shown, what=f"runner of {attempt_id}")
