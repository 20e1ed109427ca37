"""An idempotent create survives a lost response through the whole path: fleet tick ->
ProvisionerService (real gRPC) -> driver -> cloud.

What the code does, and what this test pins down: the cloud carries out the first create
(GCE: the insert; EC2: RunInstances), and its answer never arrives — the GCE fake closes
the connection instead of answering, moto's answer is thrown away by an ``after-call``
hook. The driver cannot know the outcome (GCE: ``NotYetDone``; EC2: a closed connection,
``Transient``) and says so through the provisioner's typed trailer. The tick then

- leaves the machine in ``PROVISIONING`` with no provider id — visible, not retried
  (DESIGN §2: a failed provider call leaves the machine in its transitional state, never
  silently retried) — with a ``provider_call_failed`` ledger row and an incident;
- counts it as arriving capacity, so later ticks create nothing more for the same demand;

the sweeper's reconcile vouches for it through the provider's list (matched by its
machine label) and the orphan sweep matches it by that label and never sweeps it; once it
has been PROVISIONING for the stuck-transition window, the reaper's stuck-transition net
reads the provider (a ``get`` by machine label, not a second create), finds the instance
running as the intent wants, and finishes the transition: BOOTING with that instance's id.
Throughout there is exactly one instance at the cloud for that machine id, and exactly one
create request ever reached the cloud.
"""

from __future__ import annotations

from datetime import timedelta

from tests.integration.clouds.clouds import labelled
from tests.integration.clouds.world import World, offering_id


def test_a_create_whose_answer_is_lost_leaves_one_instance_and_a_visible_machine(world: World) -> None:
    cloud = world.cloud
    cloud.lose_next_create_answer()
    job_id = world.submit("lost-1")

    report = world.tick()

    assert report.actions["create"] == 1 and report.actions["create_failed_provider_call_failed"] == 1
    (machine,) = world.machines()
    assert machine.offering_id == offering_id(cloud, 0)
    assert (machine.state, machine.intent, machine.provider_instance_id) == ("PROVISIONING", "RUNNING", None)
    (made,) = labelled(cloud, machine.id)  # the cloud did make it
    (row,) = world.failures("provider_call_failed")
    assert row.machine_id == machine.id and row.detector == "fleet_tick.scale"
    assert [i.machine_id for i in world.incidents("provider_call_failed")] == [machine.id]

    # Later ticks: the same demand, already covered by the machine on its way.
    for _ in range(3):
        world.advance(5)
        assert world.tick().actions["create"] == 0
    assert [m.id for m in world.machines()] == [machine.id]

    # The sweeper: the provider's list vouches for it, and the orphan sweep never takes it.
    world.advance(60)
    world.reconcile()
    assert world.machine(machine.id).provider_seen_at == world.clock.now()
    for _ in range(2):
        world.advance(timedelta(minutes=31).total_seconds())
        assert world.orphan_sweep().actions["orphan_destroyed"] == 0
    assert world.orphans() == {}
    assert not cloud.destroy_requested(machine.id)

    # The reaper's stuck-transition net reads the cloud and finishes the create.
    world.reap_stuck()
    finished = world.machine(machine.id)
    assert (finished.state, finished.provider_instance_id) == ("BOOTING", made.provider_instance_id)

    assert [s.provider_instance_id for s in labelled(cloud, machine.id)] == [made.provider_instance_id]
    assert [s.machine_label for s in cloud.live()] == [machine.id]
    assert cloud.create_calls() == 1
    assert world.job(job_id).state == "QUEUED"  # waiting for the machine to come up
