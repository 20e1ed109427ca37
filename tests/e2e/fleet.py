"""The whole control plane as real processes for end-to-end tests.

Every process shares one manual clock through a file (``FileClock``), so a test moves time
forward itself — a 2-hour idle timer passes in seconds — while processes, gRPC, PostgreSQL and
the local machines (agent + worker + runner processes) stay real.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import grpc
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import host_release
from gpufleet.common.clock import FileClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import (
    fleet_service_pb2_grpc,
    job_pb2,
    job_service_pb2,
    job_service_pb2_grpc,
)
from tests.support import tls
from tests.support.postgres import free_port
from tests.support.procs import ServiceProcess, start_service

T = TypeVar("T")


@dataclass
class Fleet:
    root: Path
    db_url: str
    clock: FileClock
    scheduler_port: int
    env: dict[str, str]
    procs: dict[str, ServiceProcess] = field(default_factory=dict)
    _channels: list[grpc.Channel] = field(default_factory=list)

    @property
    def sessions(self) -> sessionmaker[Session]:
        return make_sessionmaker(make_engine(self.db_url))

    @property
    def machines_root(self) -> Path:
        return self.root / "machines"

    def start(
        self, name: str, *, tag: str = "", port: int = 0, extra: dict[str, str] | None = None
    ) -> ServiceProcess:
        svc = start_service(name, self.root / "logs", {**self.env, **(extra or {})}, port=port, tag=tag)
        self.procs[name + tag] = svc
        return svc

    def start_all(self) -> None:
        self.start("provisioner")
        self.env["GPUFLEET_PROVISIONER_ADDRESS"] = self.procs["provisioner"].address
        self.start("scheduler", port=self.scheduler_port)
        self.start("reaper")
        self.start("sweeper")

    def channel(
        self, address: str, server: Role = Role.SCHEDULER, who: str | Role = Role.OPERATOR
    ) -> grpc.Channel:
        ch = tls.channel(address, server, who=who)
        self._channels.append(ch)
        return ch

    @property
    def jobs(self) -> job_service_pb2_grpc.JobServiceStub:
        return job_service_pb2_grpc.JobServiceStub(self.channel(f"127.0.0.1:{self.scheduler_port}"))

    @property
    def fleet(self) -> fleet_service_pb2_grpc.FleetServiceStub:
        return fleet_service_pb2_grpc.FleetServiceStub(self.channel(f"127.0.0.1:{self.scheduler_port}"))

    def submit(
        self,
        request_id: str,
        *,
        duration_s: int,
        workspace: str = "acme-studio",
        kind: str = "short_episode",
        **values: str,
    ) -> job_pb2.Job:
        return self.jobs.SubmitJob(
            job_service_pb2.SubmitJobRequest(
                request_id=request_id,
                job=job_pb2.Job(
                    workspace=workspace,
                    pool="l4",
                    kind=kind,
                    pipeline_version="2026.12.0",
                    tenant_values={"duration_s": str(duration_s), **values},
                ),
            ),
            timeout=10,
        )

    def get_job(self, job_id: str) -> job_pb2.Job:
        return self.jobs.GetJob(job_service_pb2.GetJobRequest(job_id=job_id), timeout=10)

    def advance_until(
        self,
        check: Callable[[], T | None],
        *,
        step_s: float = 2.0,
        max_virtual_s: float = 3600,
        real_pause_s: float = 0.05,
        what: str = "condition",
    ) -> T:
        """Move the shared clock forward in steps until ``check()`` returns something truthy."""
        moved = 0.0
        while True:
            result = check()
            if result:
                return result
            if moved >= max_virtual_s:
                raise AssertionError(
                    f"{what} not reached after {moved:.0f}s of clock time\n{self.logs_tail()}"
                )
            for name, proc in self.procs.items():
                if proc.process.poll() is not None and not getattr(proc, "expected_exit", False):
                    raise AssertionError(f"{name} exited unexpectedly:\n{proc.log()[-3000:]}")
            self.clock.advance(step_s)
            moved += step_s
            time.sleep(real_pause_s)

    def logs_tail(self) -> str:
        parts = []
        for name, proc in self.procs.items():
            parts.append(f"--- {name} ---\n{proc.log()[-1500:]}")
        for log in sorted(self.machines_root.glob("*/**/*.log"))[:6]:
            parts.append(f"--- {log} ---\n{log.read_text(errors='replace')[-800:]}")
        return "\n".join(parts)

    def machine_pids(self) -> list[int]:
        pids = []
        for pid_file in self.machines_root.glob("*/disk/agent.pid"):
            try:
                pids.append(int(pid_file.read_text().strip()))
            except ValueError:
                continue
        return pids

    def close(self) -> None:
        for ch in self._channels:
            ch.close()
        for proc in self.procs.values():
            proc.stop(timeout=5)
        for pid in self.machine_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        # The slot users and walls its local machines took on the host go with them.
        assert host_release.release_stack(self.machines_root) == []


def make_fleet(root: Path, db_url: str, **overrides: str) -> Fleet:
    # The jobs read the clock too, behind the walls, as their slot's user: the clock's folder
    # must be one slot users can traverse (pytest's own temporary folders are 0700).
    clock_dir = Path(tempfile.mkdtemp(prefix="gpufleet-clock-", dir="/tmp"))
    clock_dir.chmod(0o755)
    clock_file = clock_dir / "clock"
    clock = FileClock.create(clock_file, datetime(2026, 6, 1, 9, 0, tzinfo=UTC))
    scheduler_port = free_port()
    env = {
        "GPUFLEET_DATABASE_URL": db_url,
        "GPUFLEET_CLOCK": "file",
        "GPUFLEET_CLOCK_FILE": str(clock_file),
        "GPUFLEET_SCHEDULER_ADDRESS": f"127.0.0.1:{scheduler_port}",
        "GPUFLEET_DRIVERS": "local",
        "GPUFLEET_LOCAL_ROOT": str(root / "machines"),
        "GPUFLEET_LOCAL_AGENT_BASE_PORT": "0",
        "GPUFLEET_HEARTBEAT_S": "5",
        "GPUFLEET_TICK_S": "2",
        "GPUFLEET_IDLE_SAMPLE_WINDOW_S": "0.1",
        **{f"GPUFLEET_{k.upper()}": v for k, v in overrides.items()},
    }
    root.mkdir(parents=True, exist_ok=True)
    return Fleet(root=root, db_url=db_url, clock=clock, scheduler_port=scheduler_port, env=env)
