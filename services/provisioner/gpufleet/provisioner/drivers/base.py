"""The provider driver interface: what the provisioner asks of every cloud.

A driver is a small object behind :class:`Driver`, with typed dataclasses in and out and
its contract written on each method. One contract test suite
(``tests/integration/provisioner/test_driver_contract.py``) holds every driver to it, so
the rest of the platform can treat ``gcp``, ``aws``, ``local`` and ``sim`` the same way.

Drivers never see protobuf messages (the servicer converts at the edge) and never read
the wall clock: each receives a :class:`~gpufleet.common.clock.Clock`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Protocol

__all__ = [
    "DEPLOYMENT_LABEL",
    "MACHINE_LABEL",
    "CapacityType",
    "Driver",
    "InstanceInfo",
    "InstanceRef",
    "InstanceSpec",
    "InstanceStatus",
    "Offering",
    "Provider",
    "idempotency_key",
    "instance_labels",
]

DEPLOYMENT_LABEL = "gpufleet-deployment"
"""Every instance we create carries ``gpufleet-deployment=<deployment id>``; list reads only these."""

MACHINE_LABEL = "gpufleet-machine"
"""Every instance we create carries ``gpufleet-machine=<machine id>``: create adopts by it."""


class Provider(StrEnum):
    """Which driver owns an instance; values are the proto ``Provider`` names without prefix."""

    GCP = "GCP"
    AWS = "AWS"
    LOCAL = "LOCAL"
    SIM = "SIM"


class CapacityType(StrEnum):
    SPOT = "SPOT"
    ON_DEMAND = "ON_DEMAND"


class InstanceStatus(StrEnum):
    """What the provider says about an instance (proto ``InstanceStatus`` names)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    TERMINATED = "TERMINATED"


@dataclass(frozen=True)
class Offering:
    """One way to buy a machine: the snapshot the machine row was created with."""

    provider: Provider
    region: str
    zone: str
    instance_type: str
    slots: int
    capacity_type: CapacityType = CapacityType.ON_DEMAND
    gpu_model: str = ""
    gpu_count: int = 1
    hourly_price_micros: int = 0
    offering_id: str = ""


@dataclass(frozen=True)
class InstanceSpec:
    """What to create. ``labels`` are extra labels; the driver adds the deployment and
    machine labels itself, so no caller can forget them."""

    machine_id: str
    offering: Offering
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class InstanceRef:
    """Which instance a start/stop/destroy/get is about.

    ``provider_instance_id`` may be empty (a create whose answer was lost): the driver
    then finds the instance by its ``gpufleet-machine`` label. When it is given and names
    a different machine's instance, the instance is treated as not found.
    """

    machine_id: str
    offering: Offering
    provider_instance_id: str = ""


@dataclass(frozen=True)
class InstanceInfo:
    """What the provider says exists."""

    provider: Provider
    provider_instance_id: str
    machine_id: str
    status: InstanceStatus
    labels: Mapping[str, str]
    launch_time: datetime | None
    region: str
    zone: str
    instance_type: str
    capacity_type: CapacityType
    # host:port of the machine's agent, "" while unknown (still booting, or a hung boot).
    agent_address: str = ""
    # Stopped by itself (its agent's dead-man switch), as far as the provider can tell.
    stopped_by_itself: bool = False


def instance_labels(
    deployment_id: str, machine_id: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The labels an instance is created with; ours win over any extra of the same name."""
    return {**(extra or {}), DEPLOYMENT_LABEL: deployment_id, MACHINE_LABEL: machine_id}


_IDEMPOTENCY_NAMESPACE = uuid.UUID("5f0c7a52-3d4e-4f4b-9a77-6b7c2f0d9e11")


def idempotency_key(machine_id: str, operation: str) -> str:
    """The provider-side idempotency key for ``operation`` on ``machine_id``.

    A UUID (GCE's ``requestId`` must be one; EC2's ``ClientToken`` accepts it), derived and
    not random, so a retried call after a lost answer carries the same key. An operation
    that happens more than once in a machine's life (start, stop) must put what tells the
    occurrences apart into ``operation`` (e.g. ``"start:<generation>"``).
    """
    return str(uuid.uuid5(_IDEMPOTENCY_NAMESPACE, f"{machine_id}/{operation}"))


class Driver(Protocol):
    """One provider. Every method may raise the typed errors of
    :mod:`gpufleet.common.provider_errors` (``InstanceNotFound``, ``InsufficientCapacity``,
    ``QuotaExceeded``, ``AuthFailed``, ``Transient``, ``NotYetDone``) — built from the
    provider's error codes, never from message text — and nothing else on purpose.

    A driver acts only inside its deployment: every instance it creates carries
    ``gpufleet-deployment=<deployment id>`` and ``gpufleet-machine=<machine id>``, and an
    instance without our deployment label does not exist as far as it is concerned.
    Machine ids are never reused: creating again after a destroy is not supported.
    """

    provider: Provider
    deployment_id: str

    def create(self, spec: InstanceSpec) -> InstanceInfo:
        """Create the instance for ``spec.machine_id``, idempotently.

        First list-and-adopt: when an instance labelled with this machine id exists in our
        deployment, return it unchanged (whatever its status: a stopped one stays stopped)
        instead of creating a second one. Otherwise create it with an idempotency key
        derived from the machine id, so a retried call after a lost answer adopts too.

        Raises ``InsufficientCapacity`` for a stockout in the offering's zone,
        ``QuotaExceeded`` when the account's quota forbids it. A freshly created instance
        is ``PENDING`` or ``RUNNING``.
        """
        ...

    def start(self, ref: InstanceRef) -> InstanceInfo:
        """Start a stopped instance; its disk is the one it was stopped with.

        Starting a running or pending instance is a no-op that returns it. Raises
        ``InstanceNotFound`` when it does not exist, ``Transient`` while it is still
        stopping, ``InsufficientCapacity`` when the zone cannot start it now.
        """
        ...

    def stop(self, ref: InstanceRef) -> InstanceInfo:
        """Stop the instance and keep its disk (billing for compute ends).

        Stopping a stopped or stopping instance is a no-op that returns it. Raises
        ``InstanceNotFound`` when it does not exist.
        """
        ...

    def destroy(self, ref: InstanceRef) -> bool:
        """Destroy the instance and its disk; returns whether it existed.

        Destroying an instance that does not exist succeeds and returns False: "not found"
        means done. Afterwards ``get`` raises ``InstanceNotFound`` and ``list`` omits it (a
        driver whose provider keeps showing terminated instances filters them out).

        It returns only once the provider confirms the instance gone — a second read after
        the delete call. When the provider accepted the call but still shows the instance
        (EC2's shutting-down, a GCE delete still running) it raises ``NotYetDone``: the
        caller keeps the machine in its transitional state and asks again later (a repeat
        is harmless); meanwhile ``get`` shows the instance STOPPING, not gone.
        """
        ...

    def get(self, ref: InstanceRef) -> InstanceInfo:
        """The instance as the provider sees it now; ``InstanceNotFound`` when it is gone."""
        ...

    def list(self) -> list[InstanceInfo]:
        """Every instance labelled ``gpufleet-deployment=<our deployment id>`` — and only
        those: another deployment's instances in the same account are never returned.

        An error (e.g. ``Transient``, ``AuthFailed``) means the list could not be read, and
        the caller must not act on any instance's absence.
        """
        ...
