"""ProvisionerService: every call to a cloud, routed to the driver of the offering's provider.

The servicer validates at the edge (bad input names its field), converts messages into the
drivers' dataclasses, and lets typed errors travel: a driver's ProviderError leaves as its
gRPC code plus the kind in the trailer ``gpufleet-provider-error``, so a caller never has to
read a message to tell a stockout from an auth failure.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping

import grpc

from gpufleet.common import paging
from gpufleet.common.catalog import Catalog, OfferingSpec
from gpufleet.common.errors import FailedPrecondition, InvalidArgument, NotFound
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.provider_errors import METADATA_KEY, InsufficientCapacity, ProviderError
from gpufleet.common.violations import Violations
from gpufleet.provisioner import convert
from gpufleet.provisioner.drivers.base import Driver, InstanceInfo, InstanceRef, InstanceSpec, Provider
from gpufleet.provisioner.stockouts import Stockouts
from gpufleet.v1 import provisioner_service_pb2, provisioner_service_pb2_grpc

log = logging.getLogger(__name__)

pb = provisioner_service_pb2
# The requests that name one instance.
_InstanceRequest = (
    pb.StartInstanceRequest | pb.StopInstanceRequest | pb.DestroyInstanceRequest | pb.GetInstanceRequest
)

_INSTANCES = "instances"
_OFFERINGS = "offerings"


@contextlib.contextmanager
def _provider_trailer(context: grpc.ServicerContext) -> Iterator[None]:
    """Put a ProviderError's kind in the trailer, then let the server skeleton map its code."""
    try:
        yield
    except ProviderError as err:
        context.set_trailing_metadata(((METADATA_KEY, err.kind),))
        raise


def _instance_key(info: InstanceInfo) -> tuple[int, str]:
    return convert.provider_number(info.provider), info.provider_instance_id


class ProvisionerService(provisioner_service_pb2_grpc.ProvisionerServiceServicer):  # type: ignore[misc]
    """Routes each call to ``drivers[offering.provider]``; knows nothing of any one cloud."""

    def __init__(
        self, drivers: Mapping[Provider, Driver], catalog: Catalog, instruments: Instruments = PROCESS
    ) -> None:
        self.drivers = dict(drivers)
        self.catalog = catalog
        self.stockouts = Stockouts(catalog, instruments)

    def _driver(self, provider: Provider, field: str) -> Driver:
        driver = self.drivers.get(provider)
        if driver is None:
            configured = ", ".join(sorted(p.value for p in self.drivers)) or "none"
            raise FailedPrecondition(
                f"provider {provider.value} is not configured here (configured: {configured})", field=field
            )
        return driver

    def _ref(self, request: _InstanceRequest) -> tuple[Driver, InstanceRef]:
        found = Violations()
        machine_id = convert.machine_id(request.machine_id, found)
        offering = convert.offering(request, found)
        provider_instance_id = convert.provider_instance_id(request.provider_instance_id, found)
        found.raise_if_any()
        assert offering is not None  # (a missing one is a violation)
        ref = InstanceRef(machine_id=machine_id, offering=offering, provider_instance_id=provider_instance_id)
        return self._driver(offering.provider, "offering.provider"), ref

    def CreateInstance(self, request: pb.CreateInstanceRequest, context: grpc.ServicerContext) -> pb.Instance:
        found = Violations()
        machine_id = convert.machine_id(request.machine_id, found)
        offering = convert.offering(request, found, for_create=True)
        found.raise_if_any()
        assert offering is not None  # (a missing one is a violation)
        driver = self._driver(offering.provider, "offering.provider")
        log.info(
            "create instance",
            extra={
                "fields": {
                    "machine_id": machine_id,
                    "provider": offering.provider.value,
                    "zone": offering.zone,
                    "request_id": request.request_id,
                }
            },
        )
        with _provider_trailer(context):
            try:
                info = driver.create(InstanceSpec(machine_id=machine_id, offering=offering))
            except InsufficientCapacity:
                self.stockouts.refused(offering)
                raise
        return convert.instance_to_proto(info)

    def StartInstance(self, request: pb.StartInstanceRequest, context: grpc.ServicerContext) -> pb.Instance:
        driver, ref = self._ref(request)
        log.info(
            "start instance",
            extra={"fields": {"machine_id": ref.machine_id, "request_id": request.request_id}},
        )
        with _provider_trailer(context):
            return convert.instance_to_proto(driver.start(ref))

    def StopInstance(self, request: pb.StopInstanceRequest, context: grpc.ServicerContext) -> pb.Instance:
        driver, ref = self._ref(request)
        log.info(
            "stop instance",
            extra={"fields": {"machine_id": ref.machine_id, "request_id": request.request_id}},
        )
        with _provider_trailer(context):
            return convert.instance_to_proto(driver.stop(ref))

    def DestroyInstance(
        self, request: pb.DestroyInstanceRequest, context: grpc.ServicerContext
    ) -> pb.DestroyInstanceResponse:
        driver, ref = self._ref(request)
        with _provider_trailer(context):
            existed = driver.destroy(ref)
        log.info(
            "destroy instance",
            extra={
                "fields": {"machine_id": ref.machine_id, "existed": existed, "request_id": request.request_id}
            },
        )
        return provisioner_service_pb2.DestroyInstanceResponse(existed=existed)

    def GetInstance(self, request: pb.GetInstanceRequest, context: grpc.ServicerContext) -> pb.Instance:
        driver, ref = self._ref(request)
        with _provider_trailer(context):
            return convert.instance_to_proto(driver.get(ref))

    def ListInstances(
        self, request: pb.ListInstancesRequest, context: grpc.ServicerContext
    ) -> pb.ListInstancesResponse:
        """Every configured provider's instances in (provider, id) order, keyset-paged.

        A provider whose list fails is named in ``unreachable`` instead of failing the call,
        so the sweeper can still act on the others — and must not act on that one's absence.
        """
        size = paging.page_size(request.page_size)
        after = _instance_position(paging.decode(_INSTANCES, request.page_token))
        if request.provider:
            provider = convert.provider_of(request.provider, "provider")
            assert provider is not None  # (refused at once otherwise)
            drivers = [self._driver(provider, "provider")]
        else:
            drivers = [self.drivers[p] for p in sorted(self.drivers, key=convert.provider_number)]
        found: list[InstanceInfo] = []
        unreachable: list[str] = []
        for driver in drivers:
            try:
                found.extend(driver.list())
            except ProviderError as err:
                log.warning("cannot list %s: %s (%s)", driver.provider.value, err.message, err.kind)
                unreachable.append(f"PROVIDER_{driver.provider.value}")
            except Exception:
                log.exception("unexpected error listing %s", driver.provider.value)
                unreachable.append(f"PROVIDER_{driver.provider.value}")
        rows = sorted((i for i in found if after is None or _instance_key(i) > after), key=_instance_key)
        page = rows[:size]
        token = paging.encode(_INSTANCES, list(_instance_key(page[-1]))) if len(rows) > size else ""
        return provisioner_service_pb2.ListInstancesResponse(
            instances=[convert.instance_to_proto(i) for i in page],
            next_page_token=token,
            unreachable=unreachable,
        )

    def ListOfferings(
        self, request: pb.ListOfferingsRequest, context: grpc.ServicerContext
    ) -> pb.ListOfferingsResponse:
        """The catalogue's offerings this provisioner can serve (its configured providers),
        pool by pool in order of preference."""
        size = paging.page_size(request.page_size)
        start = paging.decode_int(_OFFERINGS, request.page_token) or 0
        if request.pool:
            pool = self.catalog.pool(request.pool)
            if pool is None:
                raise NotFound(f"no pool {request.pool!r} in the catalogue", field="pool")
            pools = [pool]
        else:
            pools = list(self.catalog.pools)
        served = {p.value for p in self.drivers}
        offerings: list[OfferingSpec] = [o for p in pools for o in p.offerings if o.provider in served]
        page = offerings[start : start + size]
        end = start + len(page)
        return provisioner_service_pb2.ListOfferingsResponse(
            offerings=[convert.offering_spec_to_proto(o) for o in page],
            next_page_token=paging.encode(_OFFERINGS, end) if end < len(offerings) else "",
        )


def _instance_position(position: object) -> tuple[int, str] | None:
    if position is None:
        return None
    if (
        isinstance(position, list)
        and len(position) == 2
        and isinstance(position[0], int)
        and isinstance(position[1], str)
    ):
        return position[0], position[1]
    raise InvalidArgument("malformed page token", field="page_token")
