"""The real ProvisionerService over a sim driver whose stops and destroys can be held.

A hung provider operation, for the reaper's side: once a machine's stop or destroy is
held (``hold("stop", machine_id)``), the call waits at the driver — as a GCE stop waits on
its long operation — until ``release()`` (or ``hold_s`` real seconds), then reaches the
SimCloud. Every call that arrives is recorded first, so a test can tell a call that was
made twice from one that was held once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gpufleet.common.clock import Clock
from gpufleet.common.grpcserver import ServiceServer
from gpufleet.provisioner.drivers.base import InstanceInfo, InstanceRef, InstanceSpec
from gpufleet.provisioner.drivers.sim import SimCloud, SimDriver
from tests.support.sim_provisioner import DEPLOYMENT, SIM_OFFERING, serve_provisioner


class HeldCalls(SimDriver):
    """The sim driver whose chosen stops and destroys wait until released."""

    def __init__(self, cloud: SimCloud, deployment_id: str, hold_s: float = 60.0) -> None:
        super().__init__(cloud, deployment_id)
        self.hold_s = hold_s
        self._lock = threading.Condition()
        self._held: set[tuple[str, str]] = set()
        self._waiting: set[tuple[str, str]] = set()
        self._released = threading.Event()
        # Every stop and destroy that arrived, (operation, machine id), in order.
        self.arrived: list[tuple[str, str]] = []

    def hold(self, op: str, machine_id: str) -> None:
        with self._lock:
            self._held.add((op, machine_id))

    def release(self) -> None:
        self._released.set()

    def wait_held(self, op: str, machine_id: str, timeout_s: float = 10.0) -> bool:
        """Until that call has arrived and is being held."""
        with self._lock:
            return self._lock.wait_for(lambda: (op, machine_id) in self._waiting, timeout=timeout_s)

    def calls_of(self, machine_id: str) -> list[str]:
        with self._lock:
            return [op for op, mid in self.arrived if mid == machine_id]

    def _arrive(self, op: str, machine_id: str) -> None:
        call = (op, machine_id)
        with self._lock:
            self.arrived.append(call)
            if call not in self._held:
                return
            self._waiting.add(call)
            self._lock.notify_all()
        try:
            self._released.wait(self.hold_s)
        finally:
            with self._lock:
                self._waiting.discard(call)

    def stop(self, ref: InstanceRef) -> InstanceInfo:
        self._arrive("stop", ref.machine_id)
        return super().stop(ref)

    def destroy(self, ref: InstanceRef) -> bool:
        self._arrive("destroy", ref.machine_id)
        return super().destroy(ref)


@dataclass
class HeldProvisioner:
    driver: HeldCalls
    server: ServiceServer

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def create(self, machine_id: str) -> InstanceInfo:
        """An instance in the sim cloud for ``machine_id``, as a CreateInstance would leave it."""
        return self.driver.create(InstanceSpec(machine_id=machine_id, offering=SIM_OFFERING))


@contextmanager
def serve_held_provisioner(clock: Clock) -> Iterator[HeldProvisioner]:
    """The real ProvisionerService over gRPC with a :class:`HeldCalls` driver; whatever is
    still held when the test ends is released."""
    driver = HeldCalls(SimCloud(clock), DEPLOYMENT)
    with serve_provisioner(driver) as server:
        try:
            yield HeldProvisioner(driver, server)
        finally:
            driver.release()
