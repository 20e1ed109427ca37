"""The instrumented driver counts every call by provider, operation and result (``OK`` or
the typed error's kind) and records its duration, around the sim cloud's real driver."""

from __future__ import annotations

import pytest

from gpufleet.common.clock import ManualClock
from gpufleet.common.metrics.catalog import PROVIDER_CALL_DURATION, PROVIDER_CALLS
from gpufleet.common.provider_errors import InsufficientCapacity
from gpufleet.provisioner.drivers.base import InstanceRef, InstanceSpec, Offering, Provider
from gpufleet.provisioner.drivers.instrumented import InstrumentedDriver
from gpufleet.provisioner.drivers.sim import SimCloud
from tests.support.metrics import MetricsProbe

OFFERING = Offering(provider=Provider.SIM, region="sim-1", zone="sim-1a", instance_type="sim.l4", slots=2)


def test_calls_are_counted_and_timed_by_provider_operation_and_result() -> None:
    probe = MetricsProbe()
    cloud = SimCloud(ManualClock())
    driver = InstrumentedDriver(cloud.driver("dep"), probe.instruments)
    cloud.set_stockout("sim-1a")
    with pytest.raises(InsufficientCapacity):
        driver.create(InstanceSpec(machine_id="m-1", offering=OFFERING))
    cloud.set_stockout("sim-1a", out=False)
    driver.create(InstanceSpec(machine_id="m-1", offering=OFFERING))
    driver.get(InstanceRef(machine_id="m-1", offering=OFFERING))

    def key(op: str, result: str) -> tuple[tuple[str, str], ...]:
        return (("operation", op), ("provider", "SIM"), ("result", result))

    expected = {key("create", "INSUFFICIENT_CAPACITY"): 1, key("create", "OK"): 1, key("get", "OK"): 1}
    assert probe.series(PROVIDER_CALLS.name) == expected
    assert probe.series(PROVIDER_CALL_DURATION.name) == expected  # a histogram's count
    probe.close()
