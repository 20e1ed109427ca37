"""The orphan sweep against each cloud: an orphan goes only after its grace window; a
foreign instance and an in-flight create survive every sweep.

The instances are made at the cloud itself, behind the platform's back: the orphans carry
our deployment label and the label of a machine with no record here (named as the
provisioner names its own, so it is exactly what a lost record leaves behind); the foreign
one carries another deployment's label; the in-flight create was made through the
provisioner for a PROVISIONING machine row that has no provider id yet (the create's answer
is still on its way). The sweep reads the cloud only through the provisioner.

Both clocks of the grace window (DESIGN §4: 30 min, counted from the provider's launch
time *and* from the first sweep that saw it) are exercised: the first orphan is first seen
*before* the launch time the cloud reports (the cloud's clock runs ahead of ours), so its
launch time decides; the second is first seen 40 minutes after its launch, so its first
sighting decides.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from gpufleet.common.convert import offering_to_proto
from gpufleet.common.db import models
from tests.integration.clouds.clouds import Cloud, labelled
from tests.integration.clouds.world import DEPLOYMENT, FOREIGN_DEPLOYMENT, POOL, World, offering_id
from tests.support.fleet_rows import add_machine

GRACE = timedelta(minutes=30)


def in_flight_create(world: World) -> str:
    """A PROVISIONING row whose create reached the cloud, with no provider id recorded yet."""
    cloud = world.cloud
    machine_id = str(uuid.uuid4())
    now = world.clock.now()
    add_machine(
        world.sessions,
        now,
        id=machine_id,
        pool_id=POOL,
        offering_id=offering_id(cloud, 1),
        provider=cloud.provider.value,
        region=cloud.region,
        zone=cloud.zones[1],
        instance_type=cloud.instance_type,
        slots=1,
        state="PROVISIONING",
        intent="RUNNING",
        provider_instance_id=None,
        requested_at=now,
        state_changed_at=now,
        first_observed_at=None,
    )
    with world.sessions() as s:
        offering = offering_to_proto(s.get_one(models.Offering, offering_id(cloud, 1)))
    world.provisioner.create(machine_id, offering, request_id=f"{machine_id}:create")
    return machine_id


def alive(cloud: Cloud, machine_id: str) -> bool:
    return bool(labelled(cloud, machine_id))


def test_an_orphan_goes_only_after_its_grace_window_and_nothing_else_is_ever_touched(world: World) -> None:
    cloud = world.cloud
    first_orphan, second_orphan, foreign = (str(uuid.uuid4()) for _ in range(3))
    first_id = cloud.plant(first_orphan, DEPLOYMENT, cloud.zones[0])
    cloud.plant(foreign, FOREIGN_DEPLOYMENT, cloud.zones[0])
    pending = in_flight_create(world)
    survivors = (foreign, pending)

    def sweep(expect_destroyed: int) -> None:
        report = world.orphan_sweep()
        assert report.actions["orphan_destroyed"] == expect_destroyed, (world.clock.now(), report)
        for machine_id in survivors:
            assert alive(cloud, machine_id), f"{machine_id} was taken"
            assert not cloud.destroy_requested(machine_id)
        in_flight = world.machine(pending)
        assert (in_flight.state, in_flight.provider_instance_id) == ("PROVISIONING", None)

    # 1. The first orphan, seen before the launch time its cloud reports: that time decides.
    launched = world.launch_time(first_id)
    first_seen = world.advance_to(launched - timedelta(minutes=10))
    sweep(expect_destroyed=0)
    row = world.orphans()[first_id]
    assert (row.machine_label, row.action, row.first_seen_at) == (first_orphan, "WAITING", first_seen)
    for at in (first_seen + GRACE, launched + GRACE - timedelta(minutes=1)):
        world.advance_to(at)  # 30 min after the first sighting; then launch + 29 min
        sweep(expect_destroyed=0)
        assert alive(cloud, first_orphan) and not cloud.destroy_requested(first_orphan)
        assert world.orphans()[first_id].action == "WAITING"
    assert world.failures("orphan_found") == []

    world.advance_to(launched + GRACE)
    sweep(expect_destroyed=1)
    assert not alive(cloud, first_orphan) and cloud.destroy_requested(first_orphan)
    assert world.orphans()[first_id].action == "DESTROYED"
    (found,) = world.failures("orphan_found")
    assert found.machine_id == first_orphan

    # 2. The second orphan, launched 40 min before any sweep saw it: the first sighting decides.
    second_id = cloud.plant(second_orphan, DEPLOYMENT, cloud.zones[1])
    first_seen = world.advance_to(world.launch_time(second_id) + timedelta(minutes=40))
    sweep(expect_destroyed=0)
    assert world.orphans()[second_id].first_seen_at == first_seen
    world.advance_to(first_seen + GRACE - timedelta(minutes=1))
    sweep(expect_destroyed=0)
    assert alive(cloud, second_orphan) and not cloud.destroy_requested(second_orphan)
    world.advance_to(first_seen + GRACE)
    sweep(expect_destroyed=1)
    assert not alive(cloud, second_orphan) and cloud.destroy_requested(second_orphan)

    assert [f.machine_id for f in world.failures("orphan_found")] == [first_orphan, second_orphan]
    # The foreign instance was never even listed; the in-flight create matched its row by label.
    assert set(world.orphans()) == {first_id, second_id}
    assert [s.machine_label for s in cloud.live() if s.deployment_label == DEPLOYMENT] == [pending]
    assert world.failures("instance_gone") == world.failures("preempted") == []
