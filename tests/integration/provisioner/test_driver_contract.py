"""The one contract every provider driver keeps (drivers/base.py), run against each driver.

Harnesses live in conftest.py; adding a driver here is one fixture there.
"""

from __future__ import annotations

import uuid

import pytest

from gpufleet.common.provider_errors import (
    AuthFailed,
    InstanceNotFound,
    InsufficientCapacity,
    NotYetDone,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from gpufleet.provisioner.drivers.base import (
    DEPLOYMENT_LABEL,
    MACHINE_LABEL,
    Driver,
    InstanceInfo,
    InstanceRef,
    InstanceSpec,
    InstanceStatus,
)
from gpufleet.provisioner.drivers.sim import SimOp
from tests.integration.provisioner.conftest import DriverHarness

DEPLOYMENT = "contract-dep"


def new_machine_id() -> str:
    return str(uuid.uuid4())


def spec_for(h: DriverHarness, machine_id: str) -> InstanceSpec:
    return InstanceSpec(machine_id=machine_id, offering=h.offering)


def ref_for(h: DriverHarness, machine_id: str, provider_instance_id: str = "") -> InstanceRef:
    return InstanceRef(machine_id=machine_id, offering=h.offering, provider_instance_id=provider_instance_id)


def await_status(
    h: DriverHarness, driver: Driver, ref: InstanceRef, status: InstanceStatus, steps: int = 200
) -> InstanceInfo:
    """Let provider time pass until the instance shows ``status``."""
    info = driver.get(ref)
    for _ in range(steps):
        if info.status is status:
            return info
        h.step()
        info = driver.get(ref)
    raise AssertionError(f"instance stayed {info.status}, never {status}")


def test_create_is_idempotent_by_machine_id(harness: DriverHarness) -> None:
    driver = harness.make_driver(DEPLOYMENT)
    machine_id = new_machine_id()
    first = driver.create(spec_for(harness, machine_id))
    second = driver.create(spec_for(harness, machine_id))
    assert second.provider_instance_id == first.provider_instance_id
    assert [i.provider_instance_id for i in driver.list() if i.machine_id == machine_id] == [
        first.provider_instance_id
    ]
    assert first.status in (InstanceStatus.PENDING, InstanceStatus.RUNNING)
    assert first.labels[DEPLOYMENT_LABEL] == DEPLOYMENT
    assert first.labels[MACHINE_LABEL] == machine_id
    assert first.launch_time is not None


def test_create_adopts_a_stopped_instance_without_starting_it(harness: DriverHarness) -> None:
    driver = harness.make_driver(DEPLOYMENT)
    machine_id = new_machine_id()
    first = driver.create(spec_for(harness, machine_id))
    ref = ref_for(harness, machine_id, first.provider_instance_id)
    await_status(harness, driver, ref, InstanceStatus.RUNNING)
    driver.stop(ref)
    await_status(harness, driver, ref, InstanceStatus.STOPPED)
    again = driver.create(spec_for(harness, machine_id))
    assert again.provider_instance_id == first.provider_instance_id
    assert again.status is InstanceStatus.STOPPED


def test_create_get_stop_start_destroy(harness: DriverHarness) -> None:
    driver = harness.make_driver(DEPLOYMENT)
    machine_id = new_machine_id()
    created = driver.create(spec_for(harness, machine_id))
    ref = ref_for(harness, machine_id, created.provider_instance_id)

    running = await_status(harness, driver, ref, InstanceStatus.RUNNING)
    assert (running.machine_id, running.zone, running.instance_type) == (
        machine_id,
        harness.offering.zone,
        harness.offering.instance_type,
    )
    # A lost create answer: the machine id alone finds the instance by its label.
    assert driver.get(ref_for(harness, machine_id)).provider_instance_id == created.provider_instance_id

    assert driver.stop(ref).status in (InstanceStatus.STOPPING, InstanceStatus.STOPPED)
    await_status(harness, driver, ref, InstanceStatus.STOPPED)
    assert driver.stop(ref).status is InstanceStatus.STOPPED  # stopping again is a no-op

    assert driver.start(ref).status in (InstanceStatus.PENDING, InstanceStatus.RUNNING)
    restarted = await_status(harness, driver, ref, InstanceStatus.RUNNING)
    assert restarted.provider_instance_id == created.provider_instance_id
    assert restarted.launch_time == created.launch_time
    assert driver.start(ref).status is InstanceStatus.RUNNING  # starting again is a no-op

    assert driver.destroy(ref) is True
    with pytest.raises(InstanceNotFound):
        driver.get(ref)
    assert machine_id not in {i.machine_id for i in driver.list()}


def test_destroy_of_a_missing_instance_succeeds_and_says_so(harness: DriverHarness) -> None:
    driver = harness.make_driver(DEPLOYMENT)
    assert driver.destroy(ref_for(harness, new_machine_id())) is False
    machine_id = new_machine_id()
    driver.create(spec_for(harness, machine_id))
    assert driver.destroy(ref_for(harness, machine_id)) is True
    assert driver.destroy(ref_for(harness, machine_id)) is False


@pytest.mark.parametrize("op", ["get", "start", "stop"])
def test_calls_on_a_missing_instance_are_instance_not_found(harness: DriverHarness, op: str) -> None:
    driver = harness.make_driver(DEPLOYMENT)
    with pytest.raises(InstanceNotFound):
        getattr(driver, op)(ref_for(harness, new_machine_id()))


def test_a_provider_instance_id_of_another_machine_is_not_found(harness: DriverHarness) -> None:
    driver = harness.make_driver(DEPLOYMENT)
    a, b = new_machine_id(), new_machine_id()
    driver.create(spec_for(harness, a))
    other = driver.create(spec_for(harness, b))
    with pytest.raises(InstanceNotFound):
        driver.get(ref_for(harness, a, other.provider_instance_id))
    assert driver.destroy(ref_for(harness, a, other.provider_instance_id)) is False
    assert driver.get(ref_for(harness, b)).provider_instance_id == other.provider_instance_id


def test_list_and_every_call_see_only_our_deployment(harness: DriverHarness) -> None:
    ours, foreign = harness.make_driver(DEPLOYMENT), harness.make_driver("someone-else")
    mine, theirs = new_machine_id(), new_machine_id()
    ours.create(spec_for(harness, mine))
    planted = foreign.create(spec_for(harness, theirs))

    assert [i.machine_id for i in ours.list()] == [mine]
    assert all(i.labels[DEPLOYMENT_LABEL] == DEPLOYMENT for i in ours.list())
    foreign_ref = ref_for(harness, theirs, planted.provider_instance_id)
    with pytest.raises(InstanceNotFound):
        ours.get(foreign_ref)
    with pytest.raises(InstanceNotFound):
        ours.stop(foreign_ref)
    assert ours.destroy(foreign_ref) is False
    assert foreign.get(foreign_ref).provider_instance_id == planted.provider_instance_id


def test_no_capacity_is_insufficient_capacity(harness: DriverHarness) -> None:
    driver = harness.make_driver(DEPLOYMENT)
    existing = new_machine_id()
    driver.create(spec_for(harness, existing))
    harness.exhaust_capacity()
    with pytest.raises(InsufficientCapacity):
        driver.create(spec_for(harness, new_machine_id()))
    # Adopting what already exists needs no capacity.
    assert driver.create(spec_for(harness, existing)).machine_id == existing
    assert [i.machine_id for i in driver.list()] == [existing]


ERRORS = [InstanceNotFound, InsufficientCapacity, QuotaExceeded, AuthFailed, Transient, NotYetDone]
OPS: list[SimOp] = ["create", "start", "stop", "destroy", "get", "list"]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e.kind)
@pytest.mark.parametrize("op", OPS)
def test_each_provider_error_arrives_with_its_type(
    scriptable_harness: DriverHarness, op: SimOp, error: type[ProviderError]
) -> None:
    h = scriptable_harness
    driver = h.make_driver(DEPLOYMENT)
    machine_id = new_machine_id()
    driver.create(spec_for(h, machine_id))
    calls = {
        "create": lambda: driver.create(spec_for(h, machine_id)),
        "start": lambda: driver.start(ref_for(h, machine_id)),
        "stop": lambda: driver.stop(ref_for(h, machine_id)),
        "destroy": lambda: driver.destroy(ref_for(h, machine_id)),
        "get": lambda: driver.get(ref_for(h, machine_id)),
        "list": driver.list,
    }
    assert h.inject is not None
    h.inject(op, error("injected"))
    with pytest.raises(error) as raised:
        calls[op]()
    assert type(raised.value) is error
    calls[op]()  # one injection, one failure: the next call goes through
