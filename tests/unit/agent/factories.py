"""Factories shared by the agent's unit tests."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from gpufleet.agent.specs import JobSpec
from gpufleet.agent.statedir import StateDir
from gpufleet.v1 import agent_service_pb2


def state_dir(tmp_path: Path) -> StateDir:
    return StateDir(tmp_path / "state").ensure()


def spec(attempt_id: str = "a-1", *, slot: int = 0, slots: int = 1, **values: str) -> JobSpec:
    return JobSpec(
        attempt_id=attempt_id,
        job_id=f"job-{attempt_id}",
        slot=slot,
        slots=slots,
        kind="short",
        pipeline_version="v1",
        tenant_values=dict(values),
    )


def start_request(
    attempt_id: str = "a-1", *, slot: int = 0, slots: int = 0, job_id: str = "job-1", **values: str
) -> agent_service_pb2.AgentServiceStartJobRequest:
    return agent_service_pb2.AgentServiceStartJobRequest(
        request_id="r",
        attempt_id=attempt_id,
        job_id=job_id,
        slot=slot,
        slots=slots,
        kind="short",
        pipeline_version="v1",
        workspace="ws",
        tenant_values=values,
    )


@dataclass
class FakeWatch:
    """A worker as the daemon sees it."""

    ever_alive: bool = True
    is_alive: bool = True
    code: int | None = None

    def alive(self) -> bool:
        return self.is_alive

    def exit_code(self) -> int | None:
        return self.code


PIPELINE = [sys.executable, "-c", "pass"]
