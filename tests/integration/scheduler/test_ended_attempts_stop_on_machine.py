"""Whenever the control plane ends an attempt — lost, timed out, taken back, cancelled —
and the machine answers, it is told to stop it, twice over: CancelJob to its agent from
the call pool, and the attempt's id in the answer to the next heartbeat of its worker that
still names it (with its lease not renewed, so the machine's fence stops it even if both
words are lost). Real PostgreSQL, the real fleet tick, JobService and WorkerService, and a
scripted agent over TLS on loopback (tests/integration/scheduler/test_tick_calls.py's
fleet)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from gpufleet.common.db import models
from gpufleet.scheduler.job_service import JobService
from gpufleet.scheduler.worker_service import WorkerService
from gpufleet.v1 import job_service_pb2, worker_service_pb2
from tests.integration.scheduler.test_tick_calls import Fleet, fleet, wait_for
from tests.support import tls
from tests.support.scripted_services import ScriptedAgent

__all__ = ["fleet"]  # the fixture, imported to be used here


def _lost(fleet: Fleet, agent: ScriptedAgent, machine_id: str) -> str:
    attempt = fleet.attempt(fleet.job(1, "RUNNING"), machine_id, 0, started_s_ago=60, lease_in_s=-1)
    lease, tick = fleet.leader("replica-a")
    assert lease.try_acquire()
    assert tick.run(fleet.clock.now()).actions["lease_expired"] == 1
    tick.settle(30)
    return attempt


def _timed_out(fleet: Fleet, agent: ScriptedAgent, machine_id: str) -> str:
    attempt = fleet.attempt(fleet.job(1, "RUNNING"), machine_id, 0, started_s_ago=700, lease_in_s=60)
    lease, tick = fleet.leader("replica-a")
    assert lease.try_acquire()
    assert tick.run(fleet.clock.now()).actions["timed_out"] == 1  # the kind's limit is 600 s
    tick.settle(30)
    return attempt


def _taken_back(fleet: Fleet, agent: ScriptedAgent, machine_id: str) -> str:
    agent.hang()  # StartJob held, as a frozen agent holds it
    job = fleet.job(1)
    lease, tick = fleet.leader("replica-a")
    assert lease.try_acquire()
    assert tick.run(fleet.clock.now()).actions["assign"] == 1
    (attempt,) = fleet.attempts_of(job)
    fleet.clock.advance(timedelta(seconds=fleet.settings.dispatch_deadline_s + 1))
    assert tick.run(fleet.clock.now()).actions["dispatch_taken_back"] == 1
    agent.release()  # it thaws and starts the attempt after all
    tick.settle(30)
    return attempt.id


def _cancelled(fleet: Fleet, agent: ScriptedAgent, machine_id: str) -> str:
    job = fleet.job(1, "RUNNING")
    attempt = fleet.attempt(job, machine_id, 0, started_s_ago=60, lease_in_s=60)
    jobs = JobService(fleet.sessions, fleet.clock, tls.transport("scheduler"))
    jobs.CancelJob(job_service_pb2.CancelJobRequest(job_id=job, reason="changed my mind"), None)
    return attempt


@pytest.mark.parametrize(
    ("end", "state"),
    [(_lost, "LOST"), (_timed_out, "TIMED_OUT"), (_taken_back, "INFRA_ERROR"), (_cancelled, None)],
    ids=["lost", "timed_out", "taken_back", "cancelled"],
)
def test_an_attempt_the_control_plane_ended_is_stopped_on_its_machine(
    fleet: Fleet, end: Callable[[Fleet, ScriptedAgent, str], str], state: str | None
) -> None:
    agent = fleet.agent()
    machine_id = fleet.machine(agent, slots=1)
    attempt_id = end(fleet, agent, machine_id)
    ended = fleet.row(models.Attempt, attempt_id)
    if state is not None:
        assert ended.state == state
    wait_for(lambda: attempt_id in agent.cancelled, "the agent to be told to stop it")

    # Its worker, which never heard (or lost the word), still names it.
    fleet.clock.advance(timedelta(seconds=1))
    workers = WorkerService(fleet.sessions, fleet.clock, fleet.settings)
    answer = workers.ReportHeartbeat(
        worker_service_pb2.ReportHeartbeatRequest(
            machine_id=machine_id, running=[worker_service_pb2.RunningAttempt(attempt_id=attempt_id, slot=0)]
        ),
        None,
    )
    assert list(answer.cancel_attempt_ids) == [attempt_id]
    assert answer.lease_s == fleet.settings.attempt_lease_s  # what the machine fences by
    assert fleet.row(models.Attempt, attempt_id).lease_expires_at == ended.lease_expires_at  # not renewed
