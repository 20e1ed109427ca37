"""The sim driver's script: latencies on the injected clock, injected errors, recorded calls."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpufleet.common.clock import ManualClock
from gpufleet.common.provider_errors import InsufficientCapacity, QuotaExceeded, Transient
from gpufleet.provisioner.drivers.base import InstanceRef, InstanceSpec, InstanceStatus, Offering, Provider
from gpufleet.provisioner.drivers.sim import SimCloud, SimLatencies

OFFERING = Offering(
    provider=Provider.SIM, region="sim-1", zone="sim-1a", instance_type="g2-standard-8", slots=2
)


def spec(machine_id: str = "m-1", zone: str = "sim-1a") -> InstanceSpec:
    return InstanceSpec(
        machine_id=machine_id,
        offering=Offering(
            provider=Provider.SIM, region="sim-1", zone=zone, instance_type="g2-standard-8", slots=2
        ),
    )


def ref(machine_id: str = "m-1") -> InstanceRef:
    return InstanceRef(machine_id=machine_id, offering=OFFERING)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def test_instance_is_pending_until_boot_latency_has_passed_on_the_clock(clock: ManualClock) -> None:
    driver = SimCloud(clock, SimLatencies(boot_s=90)).driver("dep")
    created = driver.create(spec())
    assert created.status is InstanceStatus.PENDING
    assert created.launch_time == clock.now()
    clock.advance(89.9)
    assert driver.get(ref()).status is InstanceStatus.PENDING
    clock.advance(0.1)
    assert driver.get(ref()).status is InstanceStatus.RUNNING
    assert [i.status for i in driver.list()] == [InstanceStatus.RUNNING]


def test_stop_and_start_take_their_own_latencies(clock: ManualClock) -> None:
    driver = SimCloud(clock, SimLatencies(boot_s=0, stop_s=30, start_s=60)).driver("dep")
    driver.create(spec())
    assert driver.stop(ref()).status is InstanceStatus.STOPPING
    clock.advance(29)
    assert driver.get(ref()).status is InstanceStatus.STOPPING
    with pytest.raises(Transient):  # a stopping instance cannot be started yet
        driver.start(ref())
    clock.advance(1)
    assert driver.get(ref()).status is InstanceStatus.STOPPED
    assert driver.start(ref()).status is InstanceStatus.PENDING
    clock.advance(timedelta(seconds=60))
    assert driver.get(ref()).status is InstanceStatus.RUNNING


def test_launch_time_survives_stop_and_start(clock: ManualClock) -> None:
    driver = SimCloud(clock).driver("dep")
    launched = driver.create(spec()).launch_time
    clock.advance(600)
    driver.stop(ref())
    driver.start(ref())
    assert driver.get(ref()).launch_time == launched


def test_fail_next_fires_once_per_injection_then_the_call_works(clock: ManualClock) -> None:
    cloud = SimCloud(clock)
    driver = cloud.driver("dep")
    cloud.fail_next("create", Transient("throttled"), times=2)
    for _ in range(2):
        with pytest.raises(Transient):
            driver.create(spec())
    assert cloud.all_instances() == []
    assert driver.create(spec()).machine_id == "m-1"


def test_stockout_is_per_zone_and_can_end(clock: ManualClock) -> None:
    cloud = SimCloud(clock)
    driver = cloud.driver("dep")
    cloud.set_stockout("sim-1a")
    with pytest.raises(InsufficientCapacity):
        driver.create(spec("m-1", zone="sim-1a"))
    assert driver.create(spec("m-2", zone="sim-1b")).zone == "sim-1b"
    cloud.set_stockout("sim-1a", out=False)
    assert driver.create(spec("m-1", zone="sim-1a")).zone == "sim-1a"


def test_a_stopped_instance_in_a_stocked_out_zone_cannot_start(clock: ManualClock) -> None:
    cloud = SimCloud(clock)
    driver = cloud.driver("dep")
    driver.create(spec())
    driver.stop(ref())
    cloud.set_stockout("sim-1a")
    with pytest.raises(InsufficientCapacity):
        driver.start(ref())
    assert driver.get(ref()).status is InstanceStatus.STOPPED


def test_adopting_an_existing_instance_needs_no_capacity(clock: ManualClock) -> None:
    cloud = SimCloud(clock)
    driver = cloud.driver("dep")
    first = driver.create(spec())
    cloud.set_stockout("sim-1a")
    assert driver.create(spec()).provider_instance_id == first.provider_instance_id


def test_quota_counts_every_deployment_in_the_account(clock: ManualClock) -> None:
    cloud = SimCloud(clock, max_instances=2)
    cloud.driver("other").create(spec("m-0"))
    driver = cloud.driver("dep")
    driver.create(spec("m-1"))
    with pytest.raises(QuotaExceeded):
        driver.create(spec("m-2"))
    driver.destroy(ref("m-1"))
    driver.create(spec("m-2"))


def test_every_call_is_recorded_with_its_deployment_and_time(clock: ManualClock) -> None:
    cloud = SimCloud(clock)
    driver = cloud.driver("dep")
    cloud.fail_next("stop", Transient("5xx"))
    driver.create(spec())
    clock.advance(5)
    with pytest.raises(Transient):
        driver.stop(ref())
    driver.list()
    assert [(c.op, c.deployment_id, c.machine_id) for c in cloud.calls] == [
        ("create", "dep", "m-1"),
        ("stop", "dep", "m-1"),
        ("list", "dep", ""),
    ]
    assert cloud.calls_of("stop")[0].at == clock.now()


def test_preemption_removes_a_spot_instance_or_stops_it_keeping_the_disk(clock: ManualClock) -> None:
    cloud = SimCloud(clock)
    driver = cloud.driver("dep")
    gone = driver.create(spec("m-1"))
    kept = driver.create(spec("m-2"))
    cloud.preempt(gone.provider_instance_id)
    cloud.preempt(kept.provider_instance_id, keep_disk=True)
    assert [(i.machine_id, i.status) for i in driver.list()] == [("m-2", InstanceStatus.STOPPED)]


def test_agent_address_is_shown_only_while_running(clock: ManualClock) -> None:
    cloud = SimCloud(clock, SimLatencies(boot_s=10), agent_address=lambda m: f"{m}.sim:50060")
    driver = cloud.driver("dep")
    assert driver.create(spec()).agent_address == ""
    clock.advance(10)
    assert driver.get(ref()).agent_address == "m-1.sim:50060"


def test_idempotency_keys_are_stable_uuids_per_machine_and_operation() -> None:
    import uuid

    from gpufleet.provisioner.drivers.base import idempotency_key

    key = idempotency_key("m-1", "create")
    assert key == idempotency_key("m-1", "create")
    assert uuid.UUID(key).version == 5
    assert len({key, idempotency_key("m-2", "create"), idempotency_key("m-1", "stop:1")}) == 3
