"""An in-memory provider for tests and the simulator.

:class:`SimCloud` plays one provider account shared by any number of deployments (each
a :class:`SimDriver`), so a test can plant another deployment's instance beside ours.
Latencies are scripted on the injected clock — an instance is ``PENDING`` until
``clock.now() >= created + boot_s`` — so nothing here ever sleeps, and a test moves
time with ``ManualClock.advance``. Errors are injected per operation
(:meth:`SimCloud.fail_next`) or per zone (:meth:`SimCloud.set_stockout`), and every call
is recorded (:attr:`SimCloud.calls`) so a test can assert what the platform asked for.

It is held to the same contract as the real drivers (see ``drivers/base.py``).
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from gpufleet.common.clock import Clock
from gpufleet.common.provider_errors import (
    InstanceNotFound,
    InsufficientCapacity,
    ProviderError,
    QuotaExceeded,
    Transient,
)
from gpufleet.provisioner.drivers.base import (
    DEPLOYMENT_LABEL,
    MACHINE_LABEL,
    InstanceInfo,
    InstanceRef,
    InstanceSpec,
    InstanceStatus,
    Offering,
    Provider,
    instance_labels,
)

SimOp = Literal["create", "start", "stop", "destroy", "get", "list"]


@dataclass(frozen=True)
class SimLatencies:
    """How long each transition takes, in seconds of the injected clock."""

    boot_s: float = 0.0
    start_s: float = 0.0
    stop_s: float = 0.0


@dataclass(frozen=True)
class SimCall:
    """One call a driver received (recorded before any injected error fires)."""

    op: SimOp
    deployment_id: str
    machine_id: str
    at: datetime


@dataclass
class _Instance:
    provider_instance_id: str
    machine_id: str
    labels: dict[str, str]
    offering: Offering
    launch_time: datetime
    # PENDING and STOPPING settle into RUNNING and STOPPED once the clock reaches settles_at.
    phase: InstanceStatus
    settles_at: datetime
    agent_address: str = ""

    def status(self, now: datetime) -> InstanceStatus:
        if now >= self.settles_at:
            if self.phase is InstanceStatus.PENDING:
                return InstanceStatus.RUNNING
            if self.phase is InstanceStatus.STOPPING:
                return InstanceStatus.STOPPED
        return self.phase

    def info(self, now: datetime) -> InstanceInfo:
        status = self.status(now)
        return InstanceInfo(
            provider=Provider.SIM,
            provider_instance_id=self.provider_instance_id,
            machine_id=self.machine_id,
            status=status,
            labels=dict(self.labels),
            launch_time=self.launch_time,
            region=self.offering.region,
            zone=self.offering.zone,
            instance_type=self.offering.instance_type,
            capacity_type=self.offering.capacity_type,
            agent_address=self.agent_address if status is InstanceStatus.RUNNING else "",
        )


@dataclass
class SimCloud:
    """One simulated provider account: the instances of every deployment, and the script.

    ``max_instances`` (0 = unlimited) is the account's quota across deployments;
    ``agent_address`` names the agent of a running instance (the simulator points it at a
    simulated agent), by machine id.
    """

    clock: Clock
    latencies: SimLatencies = field(default_factory=SimLatencies)
    max_instances: int = 0
    agent_address: Callable[[str], str] | None = None
    calls: list[SimCall] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.RLock()
        self._instances: dict[str, _Instance] = {}
        self._failures: dict[SimOp, deque[ProviderError]] = defaultdict(deque)
        self._stockouts: set[str] = set()
        self._ids = itertools.count(1)

    # ---- the script -------------------------------------------------------------------

    def driver(self, deployment_id: str) -> SimDriver:
        """A driver for one deployment in this account."""
        return SimDriver(self, deployment_id)

    def fail_next(self, op: SimOp, error: ProviderError, times: int = 1) -> None:
        """Make the next ``times`` calls of ``op`` (any deployment) raise ``error``."""
        with self._lock:
            self._failures[op].extend([error] * times)

    def set_stockout(self, zone: str, out: bool = True) -> None:
        """While out, creating or starting an instance in ``zone`` is InsufficientCapacity."""
        with self._lock:
            (self._stockouts.add if out else self._stockouts.discard)(zone)

    def preempt(self, provider_instance_id: str, keep_disk: bool = False) -> None:
        """The provider takes a spot instance back: it vanishes, or stops when ``keep_disk``."""
        with self._lock:
            inst = self._instances[provider_instance_id]
            if keep_disk:
                inst.phase, inst.settles_at = InstanceStatus.STOPPED, self.clock.now()
            else:
                del self._instances[provider_instance_id]

    def calls_of(self, op: SimOp) -> list[SimCall]:
        with self._lock:
            return [c for c in self.calls if c.op == op]

    def all_instances(self) -> list[InstanceInfo]:
        """Every instance in the account, whatever its deployment (for assertions)."""
        with self._lock:
            now = self.clock.now()
            return [i.info(now) for i in self._instances.values()]

    # ---- what drivers call --------------------------------------------------------------

    def _enter(self, op: SimOp, deployment_id: str, machine_id: str) -> datetime:
        now = self.clock.now()
        self.calls.append(SimCall(op, deployment_id, machine_id, now))
        queue = self._failures.get(op)
        if queue:
            raise queue.popleft()
        return now

    def _find(self, deployment_id: str, machine_id: str, provider_instance_id: str = "") -> _Instance | None:
        candidates = (
            [self._instances[provider_instance_id]]
            if provider_instance_id in self._instances
            else []
            if provider_instance_id
            else list(self._instances.values())
        )
        for inst in candidates:
            if (
                inst.labels.get(DEPLOYMENT_LABEL) == deployment_id
                and inst.labels.get(MACHINE_LABEL) == machine_id
            ):
                return inst
        return None

    def _require(self, deployment_id: str, ref: InstanceRef) -> _Instance:
        inst = self._find(deployment_id, ref.machine_id, ref.provider_instance_id)
        if inst is None:
            raise InstanceNotFound(f"no instance for machine {ref.machine_id}")
        return inst

    def create(self, deployment_id: str, spec: InstanceSpec) -> InstanceInfo:
        with self._lock:
            now = self._enter("create", deployment_id, spec.machine_id)
            existing = self._find(deployment_id, spec.machine_id)
            if existing is not None:
                return existing.info(now)
            if spec.offering.zone in self._stockouts:
                raise InsufficientCapacity(f"zone {spec.offering.zone} has no {spec.offering.instance_type}")
            if self.max_instances and len(self._instances) >= self.max_instances:
                raise QuotaExceeded(f"quota of {self.max_instances} instances reached")
            inst = _Instance(
                provider_instance_id=f"sim-{next(self._ids):08x}",
                machine_id=spec.machine_id,
                labels=instance_labels(deployment_id, spec.machine_id, spec.labels),
                offering=spec.offering,
                launch_time=now,
                phase=InstanceStatus.PENDING,
                settles_at=now + timedelta(seconds=self.latencies.boot_s),
                agent_address=self.agent_address(spec.machine_id) if self.agent_address else "",
            )
            self._instances[inst.provider_instance_id] = inst
            return inst.info(now)

    def start(self, deployment_id: str, ref: InstanceRef) -> InstanceInfo:
        with self._lock:
            now = self._enter("start", deployment_id, ref.machine_id)
            inst = self._require(deployment_id, ref)
            status = inst.status(now)
            if status is InstanceStatus.STOPPING:
                raise Transient(f"instance {inst.provider_instance_id} is still stopping")
            if status is InstanceStatus.STOPPED:
                if inst.offering.zone in self._stockouts:
                    raise InsufficientCapacity(f"zone {inst.offering.zone} cannot start it now")
                inst.phase = InstanceStatus.PENDING
                inst.settles_at = now + timedelta(seconds=self.latencies.start_s)
            return inst.info(now)

    def stop(self, deployment_id: str, ref: InstanceRef) -> InstanceInfo:
        with self._lock:
            now = self._enter("stop", deployment_id, ref.machine_id)
            inst = self._require(deployment_id, ref)
            if inst.status(now) in (InstanceStatus.PENDING, InstanceStatus.RUNNING):
                inst.phase = InstanceStatus.STOPPING
                inst.settles_at = now + timedelta(seconds=self.latencies.stop_s)
            return inst.info(now)

    def destroy(self, deployment_id: str, ref: InstanceRef) -> bool:
        with self._lock:
            self._enter("destroy", deployment_id, ref.machine_id)
            inst = self._find(deployment_id, ref.machine_id, ref.provider_instance_id)
            if inst is None:
                return False
            del self._instances[inst.provider_instance_id]
            return True

    def get(self, deployment_id: str, ref: InstanceRef) -> InstanceInfo:
        with self._lock:
            now = self._enter("get", deployment_id, ref.machine_id)
            return self._require(deployment_id, ref).info(now)

    def list(self, deployment_id: str) -> list[InstanceInfo]:
        with self._lock:
            now = self._enter("list", deployment_id, "")
            return [
                i.info(now)
                for i in self._instances.values()
                if i.labels.get(DEPLOYMENT_LABEL) == deployment_id
            ]


class SimDriver:
    """The :class:`~gpufleet.provisioner.drivers.base.Driver` of one deployment in a SimCloud."""

    provider = Provider.SIM

    def __init__(self, cloud: SimCloud, deployment_id: str) -> None:
        self.cloud = cloud
        self.deployment_id = deployment_id

    def create(self, spec: InstanceSpec) -> InstanceInfo:
        return self.cloud.create(self.deployment_id, spec)

    def start(self, ref: InstanceRef) -> InstanceInfo:
        return self.cloud.start(self.deployment_id, ref)

    def stop(self, ref: InstanceRef) -> InstanceInfo:
        return self.cloud.stop(self.deployment_id, ref)

    def destroy(self, ref: InstanceRef) -> bool:
        return self.cloud.destroy(self.deployment_id, ref)

    def get(self, ref: InstanceRef) -> InstanceInfo:
        return self.cloud.get(self.deployment_id, ref)

    def list(self) -> list[InstanceInfo]:
        return self.cloud.list(self.deployment_id)
