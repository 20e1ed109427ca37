"""The aws driver: NVIDIA L4 machines (the g6 family) in EC2, spot or on-demand.

Instances
    Created by RunInstances in the offering's zone, from the image configured for its
    region (``GPUFLEET_AWS_IMAGES``; production needs a real GPU image there — an AMI with
    the NVIDIA driver and the agent — since ids differ per region and account). Each
    instance and its root volume carry ``gpufleet-deployment`` and ``gpufleet-machine``
    tags (TagSpecifications), and IMDSv2 is required with a hop limit of 1, so nothing
    inside a job's network namespace can reach the metadata service (the instance has no
    role anyway: a machine holds no cloud credential).

Spot
    ``InstanceMarketOptions`` with ``SpotInstanceType=persistent`` and
    ``InstanceInterruptionBehavior=stop``: a spot instance the provider takes back is
    *stopped*, keeping its root volume, and the inventory reconcile sees a pre-emption.
    EC2 allows ``stop`` only for persistent requests and EBS-backed roots (our images
    must be EBS-backed; the g6 NVMe instance store is wiped by any stop, so nothing that
    must survive a stop may live there). A user-stopped persistent spot instance can be
    started again; one stopped by an interruption is restarted by EC2 when capacity
    returns, and StartInstances on it is refused until then (``IncorrectSpotRequestState``
    or ``IncorrectInstanceState``: Transient). A persistent request outlives its
    instance — terminating the instance alone reopens the request, which would launch an
    instance we never asked for — so destroy cancels the spot request first.

Idempotent create
    ``ClientToken`` = :func:`~gpufleet.provisioner.drivers.base.idempotency_key` of the
    machine id and ``"create"``, *and* list-and-adopt by the ``gpufleet-machine`` tag
    before any RunInstances. The token alone is not enough: an emulator may ignore it
    (moto does), and a token does not outlive EC2's idempotency window; the tag lookup
    alone is not enough either: DescribeInstances is eventually consistent, so a retry
    within seconds of a lost answer might not see the instance yet — the token covers
    that window on real EC2. StartInstances, StopInstances and TerminateInstances take
    no token: each is decided from the instance's current state, so repeating one is
    harmless.

What exists
    DescribeInstances with tag filters (our deployment, and the machine for a single
    instance) and ``instance-state-name`` in pending/running/stopping/stopped, through
    the paginator, in every configured region (``GPUFLEET_AWS_REGIONS``). The
    ``instance-lifecycle`` filter is never used (moto does not implement it); spot or
    on-demand is read from each instance's ``InstanceLifecycle``. A single instance is
    found by its machine tag and then matched on the given instance id, never looked up
    with ``InstanceIds``: an unknown, malformed or foreign id is simply not ours.
    Several live instances for one machine (a create that raced past both guards) are
    logged; reads answer with the oldest, destroy terminates them all.

Status and launch time
    Read by :mod:`.aws_instances`. A terminated instance is *gone*: ``get`` raises
    ``InstanceNotFound``, ``list`` omits it and ``destroy`` returns False — the Driver
    contract ("afterwards get raises InstanceNotFound and list omits it"); EC2 keeps
    showing terminated instances for about an hour. A shutting-down one is still ending:
    ``list`` omits it, ``get`` shows it STOPPING, and ``destroy`` terminates it again
    (harmless) and is not done until EC2 says terminated. The launch time is the
    instance's creation, not its last start.

Destroy is confirmed
    TerminateInstances answers at once with the instance shutting-down; EC2 finishes it
    later. After the call the driver reads the instances once more and returns only when
    none of them is left short of terminated; otherwise it raises ``NotYetDone`` (the
    terminate was accepted, the end is not confirmed), and the caller keeps the machine
    DESTROYING and reads it again — marking a machine destroyed while it still runs is how
    dstack came to bill for "terminated" instances (dstack #1551).

Errors are typed in :mod:`.aws_errors`. The driver holds no clock: EC2 calls return at
once with a transitional state, and nothing here waits.
"""

from __future__ import annotations

import builtins
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.common.errors import FailedPrecondition
from gpufleet.common.provider_errors import InstanceNotFound, NotYetDone, ProviderError, Transient
from gpufleet.common.trust.pki import MachineIssuer, machine_credential
from gpufleet.provisioner.drivers.aws_clients import Ec2ClientFactory
from gpufleet.provisioner.drivers.aws_errors import ec2_errors, error_code
from gpufleet.provisioner.drivers.aws_instances import ENDING_STATES, LIVE_STATES, instance_info, moved
from gpufleet.provisioner.drivers.base import (
    DEPLOYMENT_LABEL,
    MACHINE_LABEL,
    CapacityType,
    InstanceInfo,
    InstanceRef,
    InstanceSpec,
    InstanceStatus,
    Offering,
    Provider,
    idempotency_key,
    instance_labels,
)

__all__ = ["LIVE_STATES", "SPOT_MARKET_OPTIONS", "AwsDriver", "AwsOptions"]

log = logging.getLogger(__name__)

SPOT_MARKET_OPTIONS: Mapping[str, Any] = {
    "MarketType": "spot",
    "SpotOptions": {"SpotInstanceType": "persistent", "InstanceInterruptionBehavior": "stop"},
}

# A standard availability zone is its region plus one letter (us-east-1a -> us-east-1).
_AZ = re.compile(r"([a-z]{2}(?:-[a-z]+)+-\d+)[a-z]")


@dataclass(frozen=True)
class AwsOptions:
    """Where and how the driver launches; nothing here is a credential."""

    regions: tuple[str, ...]
    # Region -> AMI id to launch from (a GPU image; ids differ per region).
    images: Mapping[str, str]
    # Zone -> subnet id (a subnet lives in one zone); none: the default VPC's subnet.
    subnets: Mapping[str, str] = field(default_factory=dict)
    # Region -> security group ids; none: the VPC's default group.
    security_groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The agent listens here on the instance's private address.
    agent_port: int = 50060
    # DescribeInstances page size (EC2 allows 5..1000).
    page_size: int = 500


@dataclass(frozen=True)
class _Found:
    info: InstanceInfo
    spot_request_id: str


class AwsDriver:
    """The :class:`~gpufleet.provisioner.drivers.base.Driver` for EC2 (module docstring).

    ``clients`` builds the EC2 client of a region (see
    :class:`~gpufleet.provisioner.drivers.aws_clients.Ec2Clients`); the driver asks it
    for a client on every call and keeps none itself.
    """

    provider = Provider.AWS

    def __init__(
        self,
        deployment_id: str,
        options: AwsOptions,
        clients: Ec2ClientFactory,
        machine_issuer: MachineIssuer | None = None,
    ) -> None:
        self.machine_issuer = machine_issuer
        self.deployment_id = deployment_id
        self.options = options
        self.clients = clients

    # ---- the Driver ----------------------------------------------------------------------

    def create(self, spec: InstanceSpec) -> InstanceInfo:
        region = self._create_region(spec.offering)
        existing = self._find([region], spec.machine_id)
        if existing is not None:
            log.info(
                "adopting instance %s of machine %s",
                existing.info.provider_instance_id,
                spec.machine_id,
                extra={"fields": {"machine_id": spec.machine_id, "region": region}},
            )
            return existing.info
        with ec2_errors("RunInstances"):
            answer = self.clients(region).run_instances(**self.launch_request(region, spec))
        info = instance_info(region, answer["Instances"][0], self.options.agent_port)
        if info is None:
            raise ProviderError(f"EC2 RunInstances: instance of machine {spec.machine_id} ended at once")
        return info

    def start(self, ref: InstanceRef) -> InstanceInfo:
        info = self._require(ref).info
        if info.status in (InstanceStatus.PENDING, InstanceStatus.RUNNING):
            return info
        if info.status is InstanceStatus.STOPPING:
            raise Transient(f"instance {info.provider_instance_id} is still stopping")
        with ec2_errors("StartInstances"):
            answer = self.clients(info.region).start_instances(InstanceIds=[info.provider_instance_id])
        return moved(info, answer.get("StartingInstances") or [])

    def stop(self, ref: InstanceRef) -> InstanceInfo:
        info = self._require(ref).info
        if info.status in (InstanceStatus.STOPPING, InstanceStatus.STOPPED):
            return info
        with ec2_errors("StopInstances"):
            answer = self.clients(info.region).stop_instances(InstanceIds=[info.provider_instance_id])
        return moved(info, answer.get("StoppingInstances") or [])

    def destroy(self, ref: InstanceRef) -> bool:
        """Terminates every live instance of the machine — a duplicate left by a create
        that raced past both guards included, since the orphan sweep would never take an
        instance carrying a known machine's tag — after cancelling its spot request."""
        regions = self._read_regions(ref.offering)
        found = self._instances_of(regions, ref.machine_id, ending=True)
        ids = {f.info.provider_instance_id for f in found}
        if not found or (ref.provider_instance_id and ref.provider_instance_id not in ids):
            return False
        accepted: set[str] = set()
        for each in found:
            client = self.clients(each.info.region)
            if each.spot_request_id:
                self._cancel_spot_request(client, each.spot_request_id)
            try:
                with ec2_errors("TerminateInstances"):
                    client.terminate_instances(InstanceIds=[each.info.provider_instance_id])
            except InstanceNotFound:
                continue  # it went between our look and the terminate: gone is done
            accepted.add(each.info.provider_instance_id)
        if accepted:
            self._confirm_terminated(regions, ref.machine_id, accepted)
        return bool(accepted)

    def _confirm_terminated(self, regions: Iterable[str], machine_id: str, ids: set[str]) -> None:
        """The second read after TerminateInstances: ``NotYetDone`` while any of ``ids`` is
        still short of terminated (shutting-down, or — EC2's reads being eventually
        consistent — still shown as it was)."""
        left = [
            f.info
            for f in self._instances_of(regions, machine_id, ending=True)
            if f.info.provider_instance_id in ids
        ]
        if left:
            shown = ", ".join(f"{i.provider_instance_id} ({i.status.value.lower()})" for i in left)
            raise NotYetDone(
                f"EC2 accepted the terminate of machine {machine_id}'s instances but still shows {shown}; "
                "not destroyed until EC2 says terminated"
            )

    def get(self, ref: InstanceRef) -> InstanceInfo:
        # An instance shutting down is shown (STOPPING): it is not gone until terminated.
        return self._require(ref, ending=True).info

    def list(self) -> builtins.list[InstanceInfo]:
        """Our deployment's live instances in every configured region; any region that
        cannot be read fails the whole list (the caller must not act on an absence)."""
        found: builtins.list[InstanceInfo] = []
        for region in self.options.regions:
            for raw in self._describe(region, self._filters()):
                if (raw.get("State") or {}).get("Name") not in LIVE_STATES:
                    continue  # the server filtered by state; what changed since is not listed
                info = instance_info(region, raw, self.options.agent_port)
                if info is not None and info.labels.get(DEPLOYMENT_LABEL) == self.deployment_id:
                    found.append(info)
        return found

    # ---- what RunInstances is asked ---------------------------------------------------------

    def launch_request(self, region: str, spec: InstanceSpec) -> dict[str, Any]:
        """The RunInstances parameters for ``spec`` in ``region``."""
        offering = spec.offering
        labels = instance_labels(self.deployment_id, spec.machine_id, spec.labels)
        tags = [{"Key": key, "Value": labels[key]} for key in sorted(labels)]
        request: dict[str, Any] = {
            "ImageId": self.options.images[region],
            "InstanceType": offering.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": idempotency_key(spec.machine_id, "create"),
            "Placement": {"AvailabilityZone": offering.zone},
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tags},
                {"ResourceType": "volume", "Tags": tags},
            ],
            "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1},
        }
        credential = machine_credential(self.machine_issuer, spec.machine_id)
        if credential:
            # The machine's own certificate, for this instance alone: its image's boot step
            # reads the user data (IMDSv2, hop limit 1: not from a job's namespace) and writes
            # the files its agent's GPUFLEET_TLS_* name.
            request["UserData"] = json.dumps(
                {
                    "gpufleet": {
                        "machine_id": spec.machine_id,
                        "deployment_id": self.deployment_id,
                        **credential,
                    }
                }
            )
        subnet = self.options.subnets.get(offering.zone)
        if subnet:
            request["SubnetId"] = subnet
        groups = self.options.security_groups.get(region)
        if groups:
            request["SecurityGroupIds"] = list(groups)
        if offering.capacity_type is CapacityType.SPOT:
            request["InstanceMarketOptions"] = {
                "MarketType": SPOT_MARKET_OPTIONS["MarketType"],
                "SpotOptions": dict(SPOT_MARKET_OPTIONS["SpotOptions"]),
            }
        return request

    # ---- reading EC2 ----------------------------------------------------------------------

    def _create_region(self, offering: Offering) -> str:
        region = offering.region
        if not region:
            match = _AZ.fullmatch(offering.zone)
            region = match.group(1) if match else ""
        if region not in self.options.regions:
            configured = ", ".join(self.options.regions) or "none"
            raise FailedPrecondition(
                f"AWS region {region or '?'} is not configured here (GPUFLEET_AWS_REGIONS: {configured})",
                field="offering.region",
            )
        if not self.options.images.get(region):
            raise FailedPrecondition(
                f"no image configured for AWS region {region} (GPUFLEET_AWS_IMAGES)", field="offering.region"
            )
        return region

    def _read_regions(self, offering: Offering) -> tuple[str, ...]:
        # The offering's region even when no longer configured: its instances still exist.
        return (offering.region,) if offering.region else self.options.regions

    def _filters(self, machine_id: str = "", *, ending: bool = False) -> builtins.list[dict[str, Any]]:
        filters: builtins.list[dict[str, Any]] = [
            {"Name": f"tag:{DEPLOYMENT_LABEL}", "Values": [self.deployment_id]},
            {"Name": "instance-state-name", "Values": list(ENDING_STATES if ending else LIVE_STATES)},
        ]
        if machine_id:
            filters.append({"Name": f"tag:{MACHINE_LABEL}", "Values": [machine_id]})
        return filters

    def _describe(self, region: str, filters: builtins.list[dict[str, Any]]) -> builtins.list[dict[str, Any]]:
        paginator = self.clients(region).get_paginator("describe_instances")
        pages = paginator.paginate(Filters=filters, PaginationConfig={"PageSize": self.options.page_size})
        instances: builtins.list[dict[str, Any]] = []
        with ec2_errors("DescribeInstances"):
            for page in pages:
                for reservation in page.get("Reservations") or []:
                    instances.extend(reservation.get("Instances") or [])
        return instances

    def _instances_of(
        self, regions: Iterable[str], machine_id: str, *, ending: bool = False
    ) -> builtins.list[_Found]:
        """Every live instance of ``machine_id`` in our deployment, oldest first; with
        ``ending``, shutting-down ones too (a read of the machine, a destroy)."""
        wanted = ENDING_STATES if ending else LIVE_STATES
        found: builtins.list[_Found] = []
        for region in regions:
            for raw in self._describe(region, self._filters(machine_id, ending=ending)):
                if (raw.get("State") or {}).get("Name") not in wanted:
                    continue
                info = instance_info(region, raw, self.options.agent_port)
                if (
                    info is not None
                    and info.labels.get(DEPLOYMENT_LABEL) == self.deployment_id
                    and info.machine_id == machine_id
                ):
                    found.append(_Found(info, str(raw.get("SpotInstanceRequestId") or "")))
        never = datetime.max.replace(tzinfo=UTC)
        found.sort(key=lambda f: (f.info.launch_time or never, f.info.provider_instance_id))
        return found

    def _find(
        self, regions: Iterable[str], machine_id: str, provider_instance_id: str = "", *, ending: bool = False
    ) -> _Found | None:
        """The live instance of ``machine_id`` (the one with ``provider_instance_id`` when
        given). Two for one machine (a create raced past both guards) is logged, and the
        older one answers, every time the same."""
        found = self._instances_of(regions, machine_id, ending=ending)
        if provider_instance_id:
            return next((f for f in found if f.info.provider_instance_id == provider_instance_id), None)
        if len(found) > 1:
            log.warning(
                "machine %s has %d instances: %s",
                machine_id,
                len(found),
                ", ".join(f.info.provider_instance_id for f in found),
                extra={"fields": {"machine_id": machine_id}},
            )
        return found[0] if found else None

    def _require(self, ref: InstanceRef, *, ending: bool = False) -> _Found:
        found = self._find(
            self._read_regions(ref.offering), ref.machine_id, ref.provider_instance_id, ending=ending
        )
        if found is None:
            raise InstanceNotFound(f"no AWS instance for machine {ref.machine_id}")
        return found

    def _cancel_spot_request(self, client: Any, request_id: str) -> None:
        """Cancel the persistent request before its instance goes, or EC2 relaunches it;
        a request EC2 no longer knows is already done."""
        with ec2_errors("CancelSpotInstanceRequests"):
            try:
                client.cancel_spot_instance_requests(SpotInstanceRequestIds=[request_id])
            except ClientError as err:
                if error_code(err) != "InvalidSpotInstanceRequestID.NotFound":
                    raise
