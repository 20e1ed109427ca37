"""The clouds' list races (issue 27, item 3), on the GCE fake and on moto through the real SDKs.

A provider's list trails its creates: EC2's DescribeInstances is eventually consistent, and
GCE's aggregatedList is served from a view that can lag an insert (``lag_lists``). SkyPilot
dropped the record of an instance its refresh did not list yet and leaked the instance
(skypilot #4431); here the machine is *not yet listed* — kept, not re-created, looked for
again — until the grace passes, and only then does the ordinary loss path apply.
"""

from __future__ import annotations

from gpufleet.sweeper.settings import Settings as SweeperSettings
from tests.integration.clouds.clouds import labelled
from tests.integration.clouds.world import World

# The world's sweeper runs on the setting's default (GPUFLEET_NOT_LISTED_GRACE_S).
GRACE_S = float(SweeperSettings.model_fields["not_listed_grace_s"].default)


def test_a_new_instance_missing_from_the_list_is_kept_and_listed_later(world: World) -> None:
    world.cloud.lag_lists()
    world.submit("new-1")
    assert world.tick().actions["create"] == 1
    (machine,) = world.machines()
    assert machine.state == "BOOTING"

    world.advance(60)
    first = world.reconcile()
    world.advance(60)
    second = world.reconcile()

    assert (first.refusals["NOT_YET_LISTED"], second.refusals["NOT_YET_LISTED"]) == (1, 1)
    kept = world.machine(machine.id)
    assert (kept.state, kept.intent, kept.provider_seen_at) == ("BOOTING", "RUNNING", None)
    (row,) = world.failures("not_yet_listed")
    assert (row.machine_id, row.detector, row.outcome) == (machine.id, "inventory_reconcile", "NOTHING")
    assert f"within {GRACE_S:.0f}s" in row.details
    assert not [f for f in world.failures() if f.failure_class != "not_yet_listed"]
    # Nothing was re-created: one create call, one instance for the machine at the cloud.
    world.tick()
    assert world.cloud.create_calls() == 1
    assert len(world.machines()) == 1
    (instance,) = labelled(world.cloud, machine.id)
    assert instance.provider_instance_id == machine.provider_instance_id

    world.cloud.catch_up()
    world.advance(60)
    third = world.reconcile()

    assert third.refusals["NOT_YET_LISTED"] == 0
    assert third.actions["provider_seen"] == 1
    assert world.machine(machine.id).provider_seen_at == world.clock.now()
    assert len(world.failures("not_yet_listed")) == 1


def test_after_the_grace_a_machine_still_missing_is_lost_as_always(world: World) -> None:
    world.cloud.lag_lists()
    world.submit("new-2")
    assert world.tick().actions["create"] == 1
    (machine,) = world.machines()
    world.advance(60)
    assert world.reconcile().refusals["NOT_YET_LISTED"] == 1
    # It never shows up: the instance is gone for good behind the platform's back.
    world.cloud.vanish(machine.id)
    world.advance(GRACE_S)

    report = world.reconcile()

    assert report.refusals["NOT_YET_LISTED"] == 0
    assert report.actions["preempted"] == 1  # the pool's first choice is a spot offering
    (row,) = world.failures("preempted")
    assert (row.machine_id, row.outcome) == (machine.id, "REPLACE_MACHINE")
    assert world.machine(machine.id).state == "DESTROYED"
