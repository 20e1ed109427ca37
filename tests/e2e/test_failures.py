"""What happens when parts die: a worker killed mid-job, a scheduler restarted mid-job,
and a leader paused past its lease while a second replica takes over."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from datetime import datetime

from sqlalchemy import select

from gpufleet.common.db import models
from gpufleet.v1 import job_pb2, machine_pb2, worker_service_pb2, worker_service_pb2_grpc
from tests.e2e.fleet import Fleet


def running_attempt(fleet: Fleet, job_id: str) -> models.Attempt | None:
    with fleet.sessions() as s:
        return s.execute(
            select(models.Attempt).where(models.Attempt.job_id == job_id, models.Attempt.state == "RUNNING")
        ).scalar_one_or_none()


def test_killed_worker_loses_the_attempt_uncharged_and_the_job_runs_again(fleet: Fleet) -> None:
    fleet.start_all()
    job = fleet.submit("kill-worker", duration_s=400)
    first = fleet.advance_until(
        lambda: running_attempt(fleet, job.job_id), step_s=2, max_virtual_s=600, what="job running"
    )
    worker_pid = int((fleet.machines_root / first.machine_id / "disk" / "worker.pid").read_text())
    os.kill(worker_pid, signal.SIGKILL)

    done = fleet.advance_until(
        lambda: (j := fleet.get_job(job.job_id)).state == job_pb2.JOB_STATE_SUCCEEDED and j,
        step_s=3,
        max_virtual_s=2400,
        what="job succeeded on a second attempt",
    )
    states = [a.state for a in done.attempts]
    assert states == [job_pb2.ATTEMPT_STATE_LOST, job_pb2.ATTEMPT_STATE_SUCCEEDED]
    lost, ok = done.attempts
    assert lost.attempt_id == first.id
    assert not lost.charged and lost.charge_micros == 0
    assert ok.charged and ok.charge_micros > 0
    assert done.charge_micros == ok.charge_micros, "the lost attempt costs nothing"
    # One of our failures, none of the job's: a disruption when the reaper's probe reached the
    # machine's agent well after the worker went quiet (the usual case: only the worker was
    # killed), else the patient budget (job_lifecycle.lease_expiry_cause).
    assert done.failure_retries_used == 0
    assert done.lost_retries_used + done.disruptions_used == 1
    with fleet.sessions() as s:
        classes = [f.failure_class for f in s.execute(select(models.Failure)).scalars()]
    assert "lease_expired" in classes


def test_restarting_the_scheduler_mid_job_stops_nothing(fleet: Fleet) -> None:
    fleet.start_all()
    job = fleet.submit("restart-scheduler", duration_s=120)
    attempt = fleet.advance_until(
        lambda: running_attempt(fleet, job.job_id), step_s=2, max_virtual_s=600, what="job running"
    )
    old = fleet.procs.pop("scheduler")
    old.stop()
    fleet.clock.advance(15)  # the worker's reports fail meanwhile; its runner keeps going
    time.sleep(0.3)
    fleet.start("scheduler", port=fleet.scheduler_port, tag="-2")
    restarted_at = fleet.clock.now()
    # The worker's channel reconnects in real time (gRPC's back-off); the clock moves slowly
    # until its first report reaches the new scheduler, so the restart lasts seconds of
    # clock as it would in life — the steps of 2 s every 50 ms below would otherwise turn a
    # second of reconnecting under load into past half the lease, and the machine's fence
    # would rightly stop the job.
    fleet.advance_until(
        lambda: reported_since(fleet, attempt.machine_id, restarted_at),
        step_s=1,
        real_pause_s=0.5,
        max_virtual_s=25,
        what="the worker's first report to the new scheduler",
    )
    done = fleet.advance_until(
        lambda: (j := fleet.get_job(job.job_id)).state == job_pb2.JOB_STATE_SUCCEEDED and j,
        step_s=2,
        max_virtual_s=900,
        what="job succeeded after the restart",
    )
    assert [a.attempt_id for a in done.attempts] == [attempt.id], "the new leader adopted the attempt"
    assert done.attempts[0].state == job_pb2.ATTEMPT_STATE_SUCCEEDED


def reported_since(fleet: Fleet, machine_id: str, since: datetime) -> bool:
    with fleet.sessions() as s:
        at = s.get_one(models.Machine, machine_id).worker_report_at
    return at is not None and at >= since


class HangingAgent:
    """Accepts TCP connections and never answers: a machine whose agent wedged mid-call."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.held:
            c.close()


def lease_row(fleet: Fleet) -> models.LeaderLease | None:
    with fleet.sessions() as s:
        return s.get(models.LeaderLease, "scheduler")


def test_one_leader_and_a_paused_leaders_late_writes_are_refused(fleet: Fleet) -> None:
    fleet.env["GPUFLEET_MAX_RUNNING_MACHINES"] = "0"  # this test routes to a registered box only
    fleet.start("provisioner")
    fleet.env["GPUFLEET_PROVISIONER_ADDRESS"] = fleet.procs["provisioner"].address
    a = fleet.start(
        "scheduler", tag="-a", port=fleet.scheduler_port, extra={"GPUFLEET_INSTANCE_NAME": "replica-a"}
    )
    fleet.advance_until(lambda: lease_row(fleet), step_s=1, max_virtual_s=30, what="a leader")
    b = fleet.start("scheduler", tag="-b", extra={"GPUFLEET_INSTANCE_NAME": "replica-b"})
    for _ in range(5):
        fleet.clock.advance(2)
        time.sleep(0.1)
    row = lease_row(fleet)
    assert row is not None and row.holder == "replica-a" and row.epoch == 1, "exactly one leader, the first"

    hanging = HangingAgent()
    try:
        worker = worker_service_pb2_grpc.WorkerServiceStub(fleet.channel(a.address, who="machine:box-1"))
        box = worker.RegisterMachine(
            worker_service_pb2.RegisterMachineRequest(
                request_id="box-1",
                machine_id="box-1",
                agent_address=hanging.address,
                pool="l4",
                slots=1,
                workload_class=machine_pb2.WORKLOAD_CLASS_REPORTING,
            ),
            timeout=10,
        )
        assert box.origin == machine_pb2.MACHINE_ORIGIN_REGISTERED and not box.managed
        worker.ReportHeartbeat(worker_service_pb2.ReportHeartbeatRequest(machine_id="box-1"), timeout=10)
        job = fleet.submit("paused-leader", duration_s=60)

        def dispatched() -> models.Attempt | None:
            with fleet.sessions() as s:
                return s.execute(
                    select(models.Attempt).where(models.Attempt.job_id == job.job_id)
                ).scalar_one_or_none()

        attempt = fleet.advance_until(
            dispatched,
            step_s=1,
            max_virtual_s=60,
            real_pause_s=0.1,
            what="leader a dispatched the job to the wedged box",
        )
        assert attempt.state == "STARTING" and attempt.epoch == 1
        # Leader a is now blocked in its StartJob call to the wedged agent. Pause it past its lease.
        a.process.send_signal(signal.SIGSTOP)
        try:
            fleet.advance_until(
                lambda: (r := lease_row(fleet)) and r.holder == "replica-b" and r,
                step_s=1,
                max_virtual_s=60,
                real_pause_s=0.1,
                what="replica b takes over",
            )
        finally:
            a.process.send_signal(signal.SIGCONT)
        assert lease_row(fleet).epoch == 2  # type: ignore[union-attr]
        # a wakes: its call fails, and its write of that outcome carries the stale epoch.
        deadline = time.monotonic() + 40
        while "not recorded by a deposed leader" not in a.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert f"attempt {attempt.id}: the agent's refusal is not recorded by a deposed leader" in a.log()
        with fleet.sessions() as s:
            taken_back = list(
                s.execute(select(models.Failure).where(models.Failure.attempt_id == attempt.id)).scalars()
            )
        # Replica b re-dispatched the attempt and owns it: anything that ended it is b's.
        assert len(taken_back) <= 1, "the attempt was taken back once at most"
        assert all("leader epoch 2" in f.details for f in taken_back), (
            "the deposed leader's late write did not land"
        )
        assert os.kill(b.process.pid, 0) is None and lease_row(fleet).holder == "replica-b"  # type: ignore[union-attr]
    finally:
        hanging.close()
