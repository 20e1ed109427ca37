"""The issue's own scenario, with the fence (#27 item 5): the whole control plane as real
processes on PostgreSQL and real local machines (agent, worker, runner, walled job), a
shared file clock. The worker of the machine running a job is SIGKILLed, the machine and
its runner left alive. The job's processes must be gone while the scheduler's lease on the
attempt still runs — the machine alive all the while, so it is the fence and not a net —
and the retry's job, on another machine, must start after the kernel saw the first one
gone: at no instant do two attempts of the job run."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from gpufleet.agent.procs import is_alive
from gpufleet.agent.specs import AttemptResult, Outcome
from gpufleet.common.db import models
from gpufleet.v1 import job_pb2
from tests.e2e.fleet import Fleet
from tests.support.job_lifetimes import JobWatch


@pytest.fixture
def watch() -> Iterator[JobWatch]:
    jobs = JobWatch()
    yield jobs
    jobs.close()


def _running(fleet: Fleet, job_id: str, other_than: str = "") -> models.Attempt | None:
    with fleet.sessions() as s:
        return s.execute(
            select(models.Attempt).where(
                models.Attempt.job_id == job_id,
                models.Attempt.state == "RUNNING",
                models.Attempt.id != other_than,
            )
        ).scalar_one_or_none()


def _job_started(fleet: Fleet, attempt: models.Attempt) -> Path:
    """The attempt's folder on its machine, once its runner started the job."""
    folder = fleet.machines_root / attempt.machine_id / "disk" / "attempts" / attempt.id
    deadline = time.monotonic() + 30
    while not (folder / "runner.json").exists():
        assert time.monotonic() < deadline, f"the job of {attempt.id} never started"
        time.sleep(0.05)
    return folder


def test_a_killed_workers_job_is_gone_before_its_lease_ends_and_never_beside_its_retry(
    fleet: Fleet, watch: JobWatch
) -> None:
    fleet.start_all()
    job = fleet.submit("fence-kill", duration_s=400)
    first = fleet.advance_until(
        lambda: _running(fleet, job.job_id), step_s=2, max_virtual_s=600, what="job running"
    )
    disk = fleet.machines_root / first.machine_id / "disk"
    watch.track(first.id, _job_started(fleet, first))
    agent_pid = int((disk / "agent.pid").read_text())
    os.kill(int((disk / "worker.pid").read_text()), signal.SIGKILL)
    # Nothing renews it from here: the lease the scheduler holds is final.
    with fleet.sessions() as s:
        lease_end = s.get_one(models.Attempt, first.id).lease_expires_at

    # A clock second every tenth of a real second, up to a second short of the lease's end.
    while fleet.clock.now() + timedelta(seconds=1) < lease_end:
        fleet.clock.advance(1)
        time.sleep(0.1)
    assert watch.gone_at(first.id) is not None, "the job outlived the machine's fence"
    with fleet.sessions() as s:
        assert s.get_one(models.Attempt, first.id).state == "RUNNING"  # the scheduler has not moved yet
    assert is_alive(agent_pid)  # the machine is up: it was the fence, not a net

    second = fleet.advance_until(
        lambda: _running(fleet, job.job_id, other_than=first.id), step_s=2, max_virtual_s=1200, what="retry"
    )
    assert second.machine_id != first.machine_id
    watch.track(second.id, _job_started(fleet, second))
    gone = watch.gone_at(first.id)
    assert gone is not None and gone <= watch.lives[second.id].started

    done = fleet.advance_until(
        lambda: (j := fleet.get_job(job.job_id)).state == job_pb2.JOB_STATE_SUCCEEDED and j,
        step_s=3,
        max_virtual_s=2400,
        what="the job succeeded on its retry",
    )
    assert [a.state for a in done.attempts] == [job_pb2.ATTEMPT_STATE_LOST, job_pb2.ATTEMPT_STATE_SUCCEEDED]
    assert not done.attempts[0].charged
    verdict = AttemptResult.load(disk / "attempts" / first.id / "result.json")
    assert verdict is not None and verdict.outcome is Outcome.INFRA_ERROR
    assert "lease fence" in verdict.message
