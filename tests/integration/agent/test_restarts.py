"""Processes dying on a real machine: the agent, the worker, a runner. Jobs must outlive
the agent; a dead worker must stay dead and visible; nothing is reported twice or lost."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from gpufleet.agent.procs import is_alive
from gpufleet.v1 import job_pb2
from tests.integration.agent.conftest import (
    CLOCK_SPEED,
    HEARTBEAT_S,
    AgentLauncher,
    start_request,
    wait_running,
)
from tests.integration.agent.fake_scheduler import FakeWorkerService, wait_for

HEARTBEAT_REAL_S = HEARTBEAT_S / CLOCK_SPEED


def test_killing_the_agent_mid_job_leaves_the_runner_and_the_report(
    launcher: AgentLauncher, fake_scheduler: FakeWorkerService, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    agent = launcher.start(state, machine_id="machine-restart")
    with agent.client() as client:
        client.start_job(start_request("survivor", slot=0, duration_s=60))
    before = wait_running(agent, "survivor")
    worker_pid = agent.worker_pid()

    agent.kill()
    assert is_alive(before.pid)  # the runner was untouched
    again = launcher.start(state, machine_id="machine-restart")

    after = wait_running(again, "survivor")
    assert (after.pid, after.start_time) == (before.pid, before.start_time)
    assert again.worker_pid() == worker_pid  # the live worker was adopted, not doubled
    with again.client() as client:
        probe = client.probe()
        assert probe.worker_alive and probe.startup_complete
        assert client.start_job(start_request("survivor", slot=0, duration_s=60)).already_running
    done = wait_for(lambda: fake_scheduler.completion("survivor"), what="the survivor's completion")
    assert done.outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED
    assert done.machine_id == "machine-restart"


def test_a_dead_worker_stays_dead_and_visible(
    launcher: AgentLauncher, fake_scheduler: FakeWorkerService, tmp_path: Path
) -> None:
    agent = launcher.start(tmp_path / "state", machine_id="machine-silent")
    wait_for(
        lambda: [h for h in fake_scheduler.heartbeats if h.machine_id == "machine-silent"],
        what="a first heartbeat",
    )
    worker_pid = agent.worker_pid()

    os.kill(worker_pid, signal.SIGKILL)
    with agent.client() as client:
        wait_for(lambda: not client.probe().worker_alive, what="Probe to notice the dead worker")
        killed_at = time.monotonic()
        time.sleep(8 * HEARTBEAT_REAL_S)
        assert not client.probe().worker_alive  # not resurrected
        assert not [h for h in fake_scheduler.heartbeats_since(killed_at) if h.machine_id == "machine-silent"]
        assert agent.proc.poll() is None  # the daemon itself still answers


def test_a_new_worker_adopts_live_runners_and_settles_dead_ones(
    launcher: AgentLauncher, fake_scheduler: FakeWorkerService, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    agent = launcher.start(state, machine_id="machine-adopt")
    with agent.client() as client:
        client.start_job(start_request("adopted", slot=0, duration_s=60))
        client.start_job(start_request("orphaned", slot=1, duration_s=10_000))
    adopted = wait_running(agent, "adopted")
    orphaned = wait_running(agent, "orphaned")
    orphan_job_pid = int(json.loads((state / "attempts" / "orphaned" / "runner.json").read_text())["job_pid"])

    # The whole control side dies: daemon, worker, and one runner (its job lives on).
    agent.kill()
    os.kill(agent.worker_pid(), signal.SIGKILL)
    os.kill(orphaned.pid, signal.SIGKILL)
    wait_for(lambda: not is_alive(orphaned.pid), what="the runner to die")

    again = launcher.start(state, machine_id="machine-adopt")
    lost = wait_for(lambda: fake_scheduler.completion("orphaned"), what="the orphan's completion")
    assert lost.outcome == job_pb2.ATTEMPT_STATE_INFRA_ERROR
    wait_for(
        lambda: not is_alive(orphan_job_pid, environ=("GPUFLEET_JOB_SPEC=",)),
        what="the orphaned job to be killed",
    )
    assert [r.attempt_id for r in again.list_runners()] == ["adopted"]
    assert again.list_runners()[0].pid == adopted.pid
    done = wait_for(lambda: fake_scheduler.completion("adopted"), what="the adopted completion")
    assert done.outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED
