"""A zone out of GPUs: the scale step quarantines that offering and creates from the next.

Scheduler fleet tick -> ProvisionerService (real gRPC) -> the cloud's driver -> the cloud's
stand-in, for each cloud; the stockout is the cloud's own answer (GCE: an insert whose
operation fails with ZONE_RESOURCE_POOL_EXHAUSTED; EC2: InsufficientInstanceCapacity).
"""

from __future__ import annotations

from datetime import timedelta

from tests.integration.clouds.clouds import labelled
from tests.integration.clouds.world import World, offering_id


def test_a_stockout_quarantines_the_offering_and_the_next_tick_creates_from_the_next(world: World) -> None:
    cloud = world.cloud
    world.cloud.stockout(cloud.zones[0])
    job_id = world.submit("stockout-1")

    first = world.tick()

    assert first.actions["create_failed_stockout"] == 1
    (refused,) = world.machines()
    assert refused.offering_id == offering_id(cloud, 0)
    # The provider made nothing: the record ends, it neither bills nor counts as arriving.
    assert (refused.state, refused.intent, refused.provider_instance_id) == ("DESTROYED", "DESTROYED", None)
    assert labelled(cloud, refused.id) == []
    (row,) = world.failures("stockout")
    assert row.machine_id == refused.id and offering_id(cloud, 0) in row.details
    (incident,) = world.incidents("stockout")
    assert incident.machine_id == refused.id and incident.state == "OPEN"
    (quarantine,) = world.quarantines()
    now = world.clock.now()
    assert (quarantine.kind, quarantine.offering_id, quarantine.cleared_at) == (
        "OFFERING",
        offering_id(cloud, 0),
        None,
    )
    assert quarantine.expires_at == now + timedelta(minutes=30)

    world.advance(5)
    second = world.tick()

    assert second.actions["create"] == 1 and second.actions["create_failed_stockout"] == 0
    created = [m for m in world.machines() if m.id != refused.id]
    (machine,) = created
    assert machine.offering_id == offering_id(cloud, 1)
    assert (machine.state, machine.intent, machine.zone) == ("BOOTING", "RUNNING", cloud.zones[1])
    (instance,) = labelled(cloud, machine.id)
    assert instance.provider_instance_id == machine.provider_instance_id
    assert instance.zone == cloud.zones[1]
    # Nothing else at the provider: the stocked-out zone holds no instance of ours.
    assert [s.machine_label for s in cloud.live()] == [machine.id]
    assert world.job(job_id).state == "QUEUED"  # waiting for the machine to come up

    # The quarantine is in force for its 30 minutes: more demand goes past it, not into it.
    world.submit("stockout-2")
    world.advance(60)
    world.tick()
    newest = world.machines()[-1]
    assert newest.offering_id == offering_id(cloud, 1)
    assert cloud.create_calls() == 3  # the refused one, and two in the second zone


def test_a_stockout_on_starting_a_stopped_machine_makes_the_scale_step_try_the_next_offering(
    world: World,
) -> None:
    """DESIGN §7: the scale step starts the cheapest stopped machine; "a machine or offering
    that fails to start waits out an exponential back-off; a zone out of GPUs -> try the
    next, quarantine that offering for a while, open an incident". Here the stopped
    machine's zone is out of GPUs when demand arrives."""
    cloud = world.cloud
    stopped = world.stopped_machine(offering_id(cloud, 0))
    cloud.stockout_on_start(cloud.zones[0])
    job_id = world.submit("start-stockout-1")

    first = world.tick()
    assert first.actions["start"] == 1  # the stopped machine is tried first, as it should be
    for _ in range(3):  # a few ticks of the leader, seconds apart
        world.advance(5)
        world.tick()

    others = [m for m in world.machines() if m.id != stopped]
    assert [(m.offering_id, m.state) for m in others] == [(offering_id(cloud, 1), "BOOTING")], (
        "no capacity was brought up after the start was refused for lack of GPUs: "
        f"machines {[(m.offering_id, m.state) for m in world.machines()]}, "
        f"ledger {[f.failure_class for f in world.failures()]}"
    )
    (instance,) = labelled(cloud, others[0].id)
    assert instance.provider_instance_id == others[0].provider_instance_id
    assert [f.machine_id for f in world.failures("stockout")] == [stopped]
    assert [i.machine_id for i in world.incidents("stockout")] == [stopped]
    (quarantine,) = world.quarantines()
    assert (quarantine.kind, quarantine.offering_id) == ("OFFERING", offering_id(cloud, 0))
    assert world.job(job_id).state == "QUEUED"
