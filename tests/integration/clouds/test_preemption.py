"""A pre-empted spot machine's job runs again elsewhere, uncharged.

The machine is made the whole way (fleet tick -> provisioner -> driver) from the cloud's
spot offering, comes up (its row set READY with a fresh worker report, its agent the
test's), and the tick assigns the job to it (StartJob accepted). Then the cloud takes the
instance back the way that cloud does it: GCE moves a SPOT instance with
instanceTerminationAction=STOP to TERMINATED; EC2 stops a persistent spot instance with
stop behaviour. The sweeper's inventory reconcile reads that through the provisioner.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.integration.clouds.clouds import labelled
from tests.integration.clouds.world import World, offering_id


@dataclass(frozen=True)
class Running:
    job_id: str
    machine_id: str
    attempt_id: str


def run_a_job_on_a_spot_machine(world: World) -> Running:
    job_id = world.submit("spot-1")
    assert world.tick().actions["create"] == 1
    (machine,) = world.machines()
    assert machine.offering_id == offering_id(world.cloud, 0)
    assert (machine.capacity_type, machine.state) == ("SPOT", "BOOTING")
    world.advance(90)
    world.machine_came_up(machine.id)
    assert world.tick().actions["assign"] == 1
    (attempt,) = world.attempts(job_id)
    assert (attempt.machine_id, attempt.state) == (machine.id, "RUNNING")
    assert [r.attempt_id for r in world.agent.started] == [attempt.id]
    assert world.job(job_id).state == "RUNNING"
    return Running(job_id, machine.id, attempt.id)


def preempt_and_reconcile(world: World, running: Running) -> None:
    world.advance(60)
    world.cloud.preempt(running.machine_id)
    assert world.cloud.shows_preempted_stop(running.machine_id)
    report = world.reconcile()
    assert report.actions["spot_stopped"] == 1, report


def test_the_reconcile_records_the_preemption_and_requeues_the_job_uncharged(world: World) -> None:
    running = run_a_job_on_a_spot_machine(world)
    observed = world.machine(running.machine_id).first_observed_at
    assert observed is not None
    spot_run_s = (world.clock.now() - observed).total_seconds()

    preempt_and_reconcile(world, running)

    now = world.clock.now()
    # The named outcome: a spot machine the cloud stopped (not gone: instance and disk kept).
    (row,) = world.failures("spot_stopped")
    assert world.failures("preempted") == []
    assert (row.machine_id, row.detector, row.outcome) == (
        running.machine_id,
        "inventory_reconcile",
        "REPLACE_MACHINE",
    )
    (attempt,) = world.attempts(running.job_id)
    assert (attempt.state, attempt.charged, attempt.charge_micros, attempt.ended_at) == (
        "LOST",
        False,
        0,
        now,
    )
    job = world.job(running.job_id)
    # The cloud's reason: a disruption, no retry of the job's spent.
    assert (job.state, job.lost_retries_used, job.disruptions_used, job.charge_micros) == ("QUEUED", 0, 1, 0)
    assert job.not_before is not None and job.not_before > now  # the back-off
    machine = world.machine(running.machine_id)
    # It follows the provider (stopped, disk kept) and its history grows for expected cost.
    assert (machine.state, machine.intent, machine.preemption_count) == ("STOPPED", "STOPPED", 1)
    assert machine.spot_seconds == spot_run_s + 60
    (instance,) = labelled(world.cloud, running.machine_id)
    assert instance.provider_instance_id == machine.provider_instance_id

    # The same pre-emption is counted once: the next reconcile leaves a STOPPED intent alone.
    world.advance(60)
    assert world.reconcile().actions["spot_stopped"] == 0
    assert len(world.failures("spot_stopped")) == 1
    assert world.machine(running.machine_id).preemption_count == 1


def test_the_preempted_job_runs_again_on_another_machine(world: World) -> None:
    """After the back-off the fleet brings up capacity that is not the machine just taken
    back — issue 4: "a pre-empted spot machine's job runs again elsewhere, uncharged" —
    and the job is assigned there; nothing of the lost attempt is charged."""
    running = run_a_job_on_a_spot_machine(world)
    preempt_and_reconcile(world, running)
    world.advance(world.fleet_tick.settings.lost_retry_backoff_s + 1)

    report = world.tick()

    taken_back = world.machine(running.machine_id)
    assert (taken_back.state, taken_back.intent) == ("STOPPED", "STOPPED"), (
        f"the scale step restarted the machine the provider just took back ({report.actions})"
    )
    (replacement,) = [m for m in world.machines() if m.id != running.machine_id]
    assert replacement.state == "BOOTING"
    (instance,) = labelled(
        world.cloud if replacement.provider == world.cloud.provider.value else world.other, replacement.id
    )
    assert instance.provider_instance_id == replacement.provider_instance_id

    world.advance(90)
    world.machine_came_up(replacement.id)
    assert world.tick().actions["assign"] == 1

    first, second = world.attempts(running.job_id)
    assert (first.id, first.state, first.charged, first.charge_micros) == (
        running.attempt_id,
        "LOST",
        False,
        0,
    )
    assert (second.machine_id, second.state) == (replacement.id, "RUNNING")
    assert [r.attempt_id for r in world.agent.started] == [first.id, second.id]
    job = world.job(running.job_id)
    assert (job.state, job.attempt_count, job.charge_micros) == ("RUNNING", 2, 0)


def test_a_spot_machine_the_cloud_runs_again_by_itself_follows_it(world: World) -> None:
    """EC2 restarts an interrupted persistent spot instance when capacity returns, while the
    platform has the machine STOPPED: the reconcile brings the machine back to BOOTING
    (``spot_restarted``) so the nets and the money chain govern it, instead of an instance
    billing with nothing looking at it."""
    running = run_a_job_on_a_spot_machine(world)
    preempt_and_reconcile(world, running)
    world.advance(120)
    world.cloud.restart_by_itself(running.machine_id)

    report = world.reconcile()

    now = world.clock.now()
    assert report.actions["spot_restarted"] == 1, report
    machine = world.machine(running.machine_id)
    assert (machine.state, machine.intent, machine.state_changed_by) == ("BOOTING", "RUNNING", "sweeper")
    assert (machine.first_observed_at, machine.provider_seen_at) == (now, now)
    assert (machine.stop_due_at, machine.destroy_due_at, machine.lost) == (None, None, False)
    assert machine.preemption_count == 1
    (row,) = world.failures("spot_restarted")
    assert (row.machine_id, row.detector, row.outcome) == (
        running.machine_id,
        "inventory_reconcile",
        "NOTHING",
    )
    # From here it is a running machine like any other: seen, never counted again.
    world.advance(60)
    again = world.reconcile()
    assert (again.actions["spot_restarted"], again.actions["provider_seen"]) == (0, 1)
    assert len(world.failures("spot_restarted")) == 1
