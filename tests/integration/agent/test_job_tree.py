"""Nothing a job started outlives it, without the walls (``GPUFLEET_WALLS=off``, a
development machine): cancelling a job ends its process group, and a job that exits
leaving a child behind does not leave it running. With the walls on, the job's cgroup and
PID namespace do the same for children that leave the group (``setsid``, double fork):
``tests/integration/walls/test_escape.py``."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from gpufleet.v1 import job_pb2
from tests.integration.agent.conftest import AgentLauncher, AgentProcess, start_request, wait_running
from tests.integration.agent.fake_scheduler import FakeWorkerService, wait_for

# A job that starts a long-lived child (recording its pid), then either waits or exits at once.
FORKING_JOB = textwrap.dedent("""
    import json, os, subprocess, sys, time
    spec = json.load(open(os.environ["GPUFLEET_JOB_SPEC"]))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
    marker = spec["tenant_values"]["pid_file"]
    open(marker + ".tmp", "w").write(str(child.pid))
    os.replace(marker + ".tmp", marker)
    if spec["tenant_values"].get("mode") == "exit":
        sys.exit(0)
    time.sleep(1000)
""")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.fixture
def forking_agent(launcher: AgentLauncher, tmp_path: Path) -> AgentProcess:
    script = tmp_path / "forking_job.py"
    script.write_text(FORKING_JOB)
    return launcher.start(
        tmp_path / "state",
        slots=2,
        extra_env={
            "GPUFLEET_PIPELINE_COMMAND": json.dumps([sys.executable, str(script)]),
            "GPUFLEET_WALLS": "off",
        },
    )


@pytest.mark.parametrize("mode", ["cancel", "exit"])
def test_nothing_the_job_started_outlives_it(
    forking_agent: AgentProcess, fake_scheduler: FakeWorkerService, tmp_path: Path, mode: str
) -> None:
    pid_file = tmp_path / f"child-{mode}.pid"
    request = start_request(f"tree-{mode}", slot=0, duration_s=1000)
    request.tenant_values["pid_file"] = str(pid_file)
    request.tenant_values["mode"] = mode
    with forking_agent.client() as client:
        client.start_job(request)
        child = wait_for(lambda: pid_file.exists() and int(pid_file.read_text()), what="the job's child pid")
        if mode == "cancel":
            wait_running(forking_agent, f"tree-{mode}")
            client.cancel_job(f"tree-{mode}", "stop it")
    done = wait_for(lambda: fake_scheduler.completion(f"tree-{mode}"), what="completion")
    expected = job_pb2.ATTEMPT_STATE_CANCELLED if mode == "cancel" else job_pb2.ATTEMPT_STATE_SUCCEEDED
    assert done.outcome == expected
    wait_for(lambda: not alive(child), what="the job's child to be gone", timeout=10)
    assert not alive(child)
    assert os.getpgid(os.getpid()) != child
