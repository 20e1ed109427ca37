"""One job end to end on real processes: submitted through JobService, run on a local
machine, watched in order; then the idle machine is stopped and later destroyed, and the
database rows agree with what the APIs said."""

from __future__ import annotations

import threading

from sqlalchemy import select

from gpufleet.common.db import models
from gpufleet.v1 import job_pb2, job_service_pb2, machine_pb2
from tests.e2e.fleet import Fleet


def machine_states(fleet: Fleet) -> dict[str, models.Machine]:
    with fleet.sessions() as s:
        return {m.id: m for m in s.execute(select(models.Machine)).scalars()}


def test_job_runs_then_the_idle_machine_is_stopped_and_destroyed(fleet: Fleet) -> None:
    fleet.start_all()
    job = fleet.submit("lifecycle-1", duration_s=120, topic="volcanoes")

    events: list[job_pb2.JobEvent] = []
    watcher = threading.Thread(
        target=lambda: events.extend(
            fleet.jobs.WatchJob(job_service_pb2.WatchJobRequest(job_id=job.job_id), timeout=120)
        ),
        daemon=True,
    )
    watcher.start()

    done = fleet.advance_until(
        lambda: (j := fleet.get_job(job.job_id)).state == job_pb2.JOB_STATE_SUCCEEDED and j,
        step_s=2,
        max_virtual_s=900,
        what="job succeeded",
    )
    watcher.join(timeout=30)
    assert [e.state for e in events] == [
        job_pb2.JOB_STATE_QUEUED,
        # The fleet tick said why it waited: a machine was starting for it (an event when the
        # reason changes, the job still QUEUED).
        job_pb2.JOB_STATE_QUEUED,
        job_pb2.JOB_STATE_DISPATCHING,
        job_pb2.JOB_STATE_RUNNING,
        job_pb2.JOB_STATE_SUCCEEDED,
    ]
    waiting = events[1]
    assert waiting.job.pending_reason == job_pb2.PENDING_REASON_WAITING_FOR_CAPACITY, waiting
    assert waiting.message.startswith("waiting"), waiting.message
    assert waiting.job.HasField("expected_ready_time")
    assert len(done.attempts) == 1
    attempt = done.attempts[0]
    assert attempt.state == job_pb2.ATTEMPT_STATE_SUCCEEDED and attempt.charged
    # 120 s rendered on one slot, measured by the runner on the shared clock (the test moves the
    # clock in 2 s steps, so the runner notices the end a few steps late).
    assert 120 <= attempt.slot_seconds <= 200

    # The attempt was given one token per scope at its dispatch (hashes only kept here),
    # and with the attempt over, the gateway is refused them.
    with fleet.sessions() as s:
        scopes = s.execute(
            select(models.JobToken.scope).where(models.JobToken.attempt_id == attempt.attempt_id)
        ).scalars()
        assert sorted(scopes) == ["model", "voice"]

    machine_id = attempt.machine_id
    detail = fleet.fleet.GetMachine(
        __import__("gpufleet.v1.fleet_service_pb2", fromlist=["x"]).GetMachineRequest(machine_id=machine_id),
        timeout=10,
    )
    assert detail.liveness.HasField("worker_report_at")
    assert detail.liveness.HasField("composite_at")

    # Quiet now: the money chain arms both timers, stops first (disk kept), destroys later.
    fleet.advance_until(
        lambda: machine_states(fleet)[machine_id].state == "STOPPED",
        step_s=10,
        max_virtual_s=3600,
        what="machine stopped",
    )
    stopped = machine_states(fleet)[machine_id]
    assert stopped.intent == "STOPPED"
    assert stopped.destroy_due_at is not None
    assert (fleet.machines_root / machine_id).exists(), "a stopped machine keeps its disk"

    fleet.advance_until(
        lambda: machine_states(fleet)[machine_id].state == "DESTROYED",
        step_s=30,
        max_virtual_s=3 * 3600,
        what="machine destroyed",
    )
    gone = machine_states(fleet)[machine_id]
    assert gone.intent == "DESTROYED"
    assert gone.stop_due_at is None and gone.destroy_due_at is None
    assert gone.stop_due_at is None
    assert not (fleet.machines_root / machine_id).exists(), "destroy removes the machine's folder"

    # The rows agree with the API: one attempt, charged by the formula.
    with fleet.sessions() as s:
        row = s.get_one(models.Job, job.job_id)
        attempts = list(
            s.execute(select(models.Attempt).where(models.Attempt.job_id == job.job_id)).scalars()
        )
        plan = s.get_one(models.Plan, "studio")
    assert row.state == "SUCCEEDED"
    assert len(attempts) == 1 and attempts[0].state == "SUCCEEDED"
    expected = round(
        attempts[0].slot_seconds * gone.hourly_price_micros / gone.slots / 3600 * plan.rate_micros / 1_000_000
    )
    assert attempts[0].charge_micros == expected == row.charge_micros > 0
    # Destroyed machines drop out of the default listing but keep their row.
    listed = fleet.fleet.ListMachines(
        __import__("gpufleet.v1.fleet_service_pb2", fromlist=["x"]).ListMachinesRequest(), timeout=10
    )
    assert machine_id not in [m.machine_id for m in listed.machines]
    assert detail.state in (machine_pb2.MACHINE_STATE_READY, machine_pb2.MACHINE_STATE_BOOTING)
