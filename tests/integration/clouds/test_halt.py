"""Quota and auth errors halt provisioning for that provider/region, and alert.

The refusal is the cloud's own answer to the create (GCE: the insert's QUOTA_EXCEEDED
operation error, or 401 on every call; EC2: VcpuLimitExceeded on RunInstances, or
AuthFailure), carried through the provisioner as a typed error. From then on the scale
step goes to the other cloud and sends that cloud/region nothing — checked at the
provider's own request record — until an operator clears the quarantine through
ReaperService.ClearQuarantine.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.integration.clouds.clouds import Cloud, labelled
from tests.integration.clouds.world import World, offering_id


@dataclass(frozen=True)
class Refusal:
    failure_class: str
    refuse: str  # the Cloud method that scripts it
    fix: str  # the Cloud method a human's fix stands for


REFUSALS = {
    "quota": Refusal("quota_exceeded", "exceed_quota", "lift_quota"),
    "auth": Refusal("auth_failed", "refuse_credentials", "accept_credentials"),
}


@pytest.mark.parametrize("refusal", list(REFUSALS.values()), ids=list(REFUSALS))
def test_a_quota_or_auth_refusal_halts_the_region_until_an_operator_clears_it(
    world: World, refusal: Refusal
) -> None:
    cloud, other = world.cloud, world.other
    getattr(cloud, refusal.refuse)()
    world.submit("halt-1")

    first = world.tick()

    assert first.actions[f"create_failed_{refusal.failure_class}"] == 1
    (refused,) = world.machines()
    assert refused.offering_id == offering_id(cloud, 0)
    assert (refused.state, refused.intent) == ("DESTROYED", "DESTROYED")
    assert labelled(cloud, refused.id) == []
    (row,) = world.failures(refusal.failure_class)
    assert row.machine_id == refused.id and row.outcome == "HALT_PROVISIONING"
    (incident,) = world.incidents(refusal.failure_class)
    assert incident.state == "OPEN"
    (halt,) = world.quarantines()
    assert (halt.kind, halt.provider, halt.region, halt.offering_id) == (
        "PROVIDER_REGION",
        cloud.provider.value,
        cloud.region,
        None,
    )
    assert halt.expires_at is None and halt.cleared_at is None  # until a human clears it

    calls_at_halt = cloud.calls()
    # Both of the cloud's zones are in the halted region: the other cloud serves, tick after tick.
    for n, request_id in enumerate(["halt-1", "halt-2", "halt-3"]):
        if n:
            world.submit(request_id)
        world.advance(5)
        report = world.tick()
        assert report.actions["create"] == 1, report
        newest = world.machines()[-1]
        assert newest.offering_id == offering_id(other, 0)
        assert newest.state == "BOOTING"
        (instance,) = labelled(other, newest.id)
        assert instance.provider_instance_id == newest.provider_instance_id
    assert cloud.calls() == calls_at_halt, "a halted provider/region was called again"
    assert _ours(cloud) == []

    # A human fixes the account, then clears the halt: the cloud serves again.
    getattr(cloud, refusal.fix)()
    world.clear_quarantine(halt.id)
    (cleared,) = world.quarantines()
    assert cleared.cleared_at == world.clock.now()
    world.submit("halt-4")
    world.advance(5)
    report = world.tick()

    assert report.actions["create"] == 1, report
    back = world.machines()[-1]
    assert back.offering_id == offering_id(cloud, 0)
    assert back.state == "BOOTING"
    (instance,) = labelled(cloud, back.id)
    assert instance.provider_instance_id == back.provider_instance_id
    assert cloud.calls() > calls_at_halt
    assert len(world.failures(refusal.failure_class)) == 1  # one refusal, one row, one incident
    assert len(world.incidents(refusal.failure_class)) == 1


def _ours(cloud: Cloud) -> list[str]:
    return [s.machine_label for s in cloud.live() if s.deployment_label == "clouds-test"]
