"""Pre-emptions and vanished instances, against the real ProvisionerService and its sim
cloud: the job on a machine the provider took back goes back to the queue uncharged, the
machine follows the provider and its pre-emption history grows — and a deliberate stop is
never undone nor counted."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import update

from gpufleet.common.db.models import Attempt, Job, Machine
from gpufleet.common.ledger import OutcomePolicy
from gpufleet.common.provider_errors import Transient
from gpufleet.provisioner.drivers.base import InstanceRef
from gpufleet.sweeper.inventory_reconcile import decide
from gpufleet.sweeper.listing import ListedInstance
from gpufleet.sweeper.machine_loss import apply_loss
from tests.integration.sweeper.conftest import Sweep
from tests.support.fleet_rows import add_attempt, add_machine, machine
from tests.support.sim_provisioner import DEPLOYMENT, SIM_OFFERING, SimProvisioner


def sim_machine(sweep: Sweep, machine_id: str, now: datetime, **overrides: object) -> str:
    """A machine row with its instance in the sim cloud, as a finished create leaves them."""
    sim: SimProvisioner = sweep.provisioner
    instance = sim.create(machine_id)
    return add_machine(
        sweep.sessions, now, id=machine_id, provider_instance_id=instance.provider_instance_id, **overrides
    )


def attempt_and_job(sweep: Sweep, attempt_id: str) -> tuple[Attempt, Job]:
    with sweep.sessions() as s:
        attempt = s.get_one(Attempt, attempt_id)
        return attempt, s.get_one(Job, attempt.job_id)


@pytest.mark.parametrize(
    ("keep_disk", "end_state", "end_intent", "failure_class"),
    [(True, "STOPPED", "STOPPED", "spot_stopped"), (False, "DESTROYED", "DESTROYED", "preempted")],
    ids=["stopped-disk-kept", "terminated"],
)
def test_a_preempted_spot_machines_job_goes_back_to_the_queue_uncharged(
    sim_sweep: Sweep, keep_disk: bool, end_state: str, end_intent: str, failure_class: str
) -> None:
    sweep, sim = sim_sweep, sim_sweep.provisioner
    start = sweep.clock.now()
    spot = sim_machine(sweep, "m-spot", start, capacity_type="SPOT")
    other = sim_machine(sweep, "m-other", start)
    attempt_id = add_attempt(sweep.sessions, start, spot)
    sweep.tick()
    assert machine(sweep.sessions, spot).provider_seen_at == start

    sweep.clock.advance(timedelta(minutes=10))
    sim.cloud.preempt(machine(sweep.sessions, spot).provider_instance_id, keep_disk=keep_disk)
    sweep.step(60)
    noticed = sweep.clock.now()

    attempt, job = attempt_and_job(sweep, attempt_id)
    assert (attempt.state, attempt.charged, attempt.charge_micros) == ("LOST", False, 0)
    assert attempt.ended_at == noticed
    assert attempt.slot_seconds == (noticed - start).total_seconds()
    # The cloud's own reason: the job spends no retry of its own nor of the patient budget.
    assert (job.state, job.lost_retries_used, job.failure_retries_used, job.charge_micros) == (
        "QUEUED",
        0,
        0,
        0,
    )
    assert job.disruptions_used == 1
    assert job.not_before == noticed + timedelta(seconds=30)
    assert "not charged" in job.status_message
    [row] = sweep.failures()
    assert (row.failure_class, row.machine_id, row.detector, row.outcome) == (
        failure_class,
        spot,
        "inventory_reconcile",
        "REPLACE_MACHINE",
    )
    assert attempt_id in row.details
    lost = machine(sweep.sessions, spot)
    assert (lost.state, lost.intent, lost.preemption_count) == (end_state, end_intent, 1)
    assert lost.state_changed_by == "sweeper"
    assert lost.state_reason.startswith(
        "inventory_reconcile: spot instance stopped by the provider's pre-emption"
        if keep_disk
        else "inventory_reconcile: spot instance pre-empted by the provider"
    )
    # Spot time this run: from when the platform last saw it start (an hour before the
    # test began) to the reconcile that noticed.
    assert lost.first_observed_at is not None
    assert lost.spot_seconds == (noticed - lost.first_observed_at).total_seconds()
    # Nothing routes to it: only the other machine is still READY, so the requeued job can
    # only run again elsewhere.
    assert machine(sweep.sessions, other).state == "READY"
    assert machine(sweep.sessions, other).provider_seen_at == noticed

    # The loss is counted once: later reconciles leave it alone (its intent follows it).
    for _ in range(3):
        sweep.step(60)
    assert machine(sweep.sessions, spot).preemption_count == 1
    assert len(sweep.failures()) == 1
    # The sweeper never calls the provider about it: no start, stop or destroy.
    assert {c.op for c in sim.cloud.calls} <= {"create", "list", "get"}


def test_an_on_demand_instance_that_vanished_is_lost_but_not_a_preemption(sim_sweep: Sweep) -> None:
    sweep, sim = sim_sweep, sim_sweep.provisioner
    now = sweep.clock.now()
    mid = sim_machine(sweep, "m-od", now)
    attempt_id = add_attempt(sweep.sessions, now, mid)
    sweep.tick()
    sim.cloud.preempt(machine(sweep.sessions, mid).provider_instance_id)  # it vanishes
    sweep.step(60)
    attempt, job = attempt_and_job(sweep, attempt_id)
    assert (attempt.state, attempt.charged, job.state, job.lost_retries_used) == ("LOST", False, "QUEUED", 0)
    assert job.disruptions_used == 1  # gone from the cloud's list: not the job's doing
    [row] = sweep.failures()
    assert (row.failure_class, row.machine_id) == ("instance_gone", mid)
    assert "vanished" in row.details
    gone = machine(sweep.sessions, mid)
    assert (gone.state, gone.intent, gone.preemption_count, gone.spot_seconds) == (
        "DESTROYED",
        "DESTROYED",
        0,
        0.0,
    )
    # Absence from the list was confirmed with a fresh read of that one instance.
    assert [c.machine_id for c in sim.cloud.calls_of("get")] == [mid]


def test_absence_is_not_concluded_while_the_fresh_read_fails(sim_sweep: Sweep) -> None:
    sweep, sim = sim_sweep, sim_sweep.provisioner
    now = sweep.clock.now()
    mid = sim_machine(sweep, "m-spot", now, capacity_type="SPOT")
    attempt_id = add_attempt(sweep.sessions, now, mid)
    sweep.tick()
    sim.cloud.preempt(machine(sweep.sessions, mid).provider_instance_id)
    sim.cloud.fail_next("get", Transient("throttled"))
    sweep.step(60)
    assert attempt_and_job(sweep, attempt_id)[0].state == "RUNNING"
    assert machine(sweep.sessions, mid).state == "READY"
    assert sweep.failures() == []
    sweep.step(60)
    assert attempt_and_job(sweep, attempt_id)[0].state == "LOST"
    assert machine(sweep.sessions, mid).preemption_count == 1


def test_an_unreachable_provider_means_no_conclusion_this_round(sim_sweep: Sweep) -> None:
    sweep, sim = sim_sweep, sim_sweep.provisioner
    now = sweep.clock.now()
    mid = sim_machine(sweep, "m-spot", now, capacity_type="SPOT")
    attempt_id = add_attempt(sweep.sessions, now, mid)
    sweep.tick()
    sim.cloud.preempt(machine(sweep.sessions, mid).provider_instance_id)
    sweep.clock.advance(timedelta(seconds=60))
    sim.cloud.fail_next("list", Transient("provider API down"))
    sweep.reconcile.reconcile(sweep.clock.now(), lease=sweep.lease)
    assert attempt_and_job(sweep, attempt_id)[0].state == "RUNNING"
    assert (machine(sweep.sessions, mid).state, sweep.failures()) == ("READY", [])
    sweep.reconcile.reconcile(sweep.clock.now(), lease=sweep.lease)  # the provider answers again
    assert attempt_and_job(sweep, attempt_id)[0].state == "LOST"


@pytest.mark.parametrize("state", ["STOPPED", "STOPPING"])
def test_a_deliberate_stop_is_never_undone_nor_counted_as_a_preemption(sim_sweep: Sweep, state: str) -> None:
    sweep, sim = sim_sweep, sim_sweep.provisioner
    now = sweep.clock.now()
    mid = sim_machine(sweep, "m-stopped", now, capacity_type="SPOT", state=state, intent="STOPPED")
    instance_id = machine(sweep.sessions, mid).provider_instance_id or ""
    # The reaper's stop: intent recorded first, then the provider call.
    sim.cloud.driver(DEPLOYMENT).stop(InstanceRef(mid, SIM_OFFERING, instance_id))
    for _ in range(5):
        sweep.step(60)
    kept = machine(sweep.sessions, mid)
    assert (kept.state, kept.intent, kept.preemption_count, kept.spot_seconds) == (state, "STOPPED", 0, 0.0)
    assert kept.provider_seen_at is None
    assert sweep.failures() == []
    assert [c.op for c in sim.cloud.calls if c.op not in ("list",)] == ["create", "stop"]
    # And once the provider gives it up entirely, it is still nobody's pre-emption.
    sim.cloud.preempt(instance_id)
    sweep.step(60)
    assert machine(sweep.sessions, mid).preemption_count == 0
    assert sweep.failures() == []


def test_a_machine_that_changed_since_the_scan_is_left_alone(sim_sweep: Sweep) -> None:
    """The write re-checks what the scan saw: a stop recorded in between wins."""
    sweep = sim_sweep
    now = sweep.clock.now()
    mid = sim_machine(sweep, "m-spot", now, capacity_type="SPOT")
    attempt_id = add_attempt(sweep.sessions, now, mid)
    listed = [ListedInstance("SIM", machine(sweep.sessions, mid).provider_instance_id or "", mid, "STOPPED")]
    [loss] = decide(now, sweep.reconcile.scan(), listed, []).losses
    with sweep.sessions() as s, s.begin():
        s.execute(update(Machine).where(Machine.id == mid).values(intent="STOPPED", state="STOPPING"))
    assert sweep.lease.try_acquire()
    assert (
        apply_loss(sweep.sessions, sweep.lease, now, loss, detector="test", outcomes=OutcomePolicy()) is None
    )
    kept = machine(sweep.sessions, mid)
    assert (kept.state, kept.intent, kept.preemption_count) == ("STOPPING", "STOPPED", 0)
    assert attempt_and_job(sweep, attempt_id)[0].state == "RUNNING"
    assert sweep.failures() == []
