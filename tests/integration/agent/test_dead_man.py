"""The agent's dead-man switch on real agent processes (real worker, real runners): an
idle machine whose control plane went quiet stops itself — ends its session, leaving its
marker on the disk — and a machine running a job never does, however long the silence."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

from gpufleet.common.errors import GpufleetError
from tests.integration.agent.conftest import (
    CLOCK_SPEED,
    AgentLauncher,
    AgentProcess,
    start_request,
    wait_running,
)
from tests.integration.agent.fake_scheduler import wait_for

LIMIT_S = 60.0  # clock seconds: 3 s of real time at the tests' clock speed
DEAD_MAN = {
    "GPUFLEET_DEAD_MAN_AFTER_S": str(LIMIT_S),
    "GPUFLEET_DEAD_MAN_ACTION": "session",
    "GPUFLEET_DEAD_MAN_EVERY_S": "0.1",
}
LIMIT_REAL_S = LIMIT_S / CLOCK_SPEED


def state(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name / "state"


def alive(pid: int) -> bool:
    """Running, not merely a zombie left for init to reap."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def stopped_itself(agent: AgentProcess) -> bool:
    return agent.proc.poll() is not None


def test_an_idle_machine_stops_itself_only_once_the_control_plane_goes_quiet(
    launcher: AgentLauncher, tmp_path: Path
) -> None:
    agent = launcher.start(state(tmp_path, "idle"), machine_id="dm-idle", extra_env=DEAD_MAN)
    worker = agent.worker_pid()
    # A control plane that keeps sampling it (as the reaper does every 30 s) for well past
    # the limit: nothing happens.
    with agent.client() as client:
        until = time.monotonic() + 2.5 * LIMIT_REAL_S
        while time.monotonic() < until:
            client.sample(timedelta(0))
            time.sleep(0.1)
    assert not stopped_itself(agent) and not (agent.state_dir / "stopped_by_itself").exists()
    # The control plane is gone: within the limit (and a look), the machine ends itself.
    gone_at = time.monotonic()
    wait_for(lambda: stopped_itself(agent), timeout=LIMIT_REAL_S + 15, what="the machine to stop itself")
    assert time.monotonic() - gone_at >= LIMIT_REAL_S * 0.9
    assert not alive(worker), "the worker ended with its machine"
    marker = (agent.state_dir / "stopped_by_itself").read_text()
    assert "no control-plane call" in marker and "session" in marker


def test_a_machine_running_a_job_never_stops_itself(launcher: AgentLauncher, tmp_path: Path) -> None:
    agent = launcher.start(state(tmp_path, "busy"), machine_id="dm-busy", extra_env=DEAD_MAN)
    with agent.client() as client:
        client.start_job(start_request("dm-job", slot=0, duration_s=10_000))
    wait_running(agent, "dm-job")
    # Silence for four times the limit while the job runs: it keeps running.
    time.sleep(4 * LIMIT_REAL_S)
    assert not stopped_itself(agent)
    assert any(r.attempt_id == "dm-job" for r in agent.list_runners())
    assert not (agent.state_dir / "stopped_by_itself").exists()
    # Cancelled (a control-plane call), the machine is idle: after the limit it stops.
    with agent.client() as client:
        client.cancel_job("dm-job", "test over")
    wait_for(lambda: stopped_itself(agent), timeout=LIMIT_REAL_S + 20, what="the idle machine to stop itself")


def test_an_agent_with_the_switch_off_keeps_running(launcher: AgentLauncher, tmp_path: Path) -> None:
    agent = launcher.start(
        state(tmp_path, "off"),
        machine_id="dm-off",
        extra_env={**DEAD_MAN, "GPUFLEET_DEAD_MAN_ACTION": "off"},
    )
    time.sleep(2.5 * LIMIT_REAL_S)
    assert not stopped_itself(agent)
    try:
        with agent.client() as client:
            assert client.probe().machine_id == "dm-off"
    except GpufleetError as err:  # pragma: no cover - a failure here is the finding
        raise AssertionError(f"the agent stopped answering: {err}") from err
