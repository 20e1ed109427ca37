"""Client of ProvisionerService, used by the scheduler, reaper and sweeper."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from gpufleet.common import grpcclient
from gpufleet.common.provider_errors import BY_KIND, METADATA_KEY, ProviderError, Transient
from gpufleet.common.trust.identity import Role
from gpufleet.common.trust.transport import Transport
from gpufleet.v1 import machine_pb2, provisioner_service_pb2, provisioner_service_pb2_grpc

T = TypeVar("T")


def _provider_error(err: grpc.RpcError) -> Exception:
    kind = grpcclient.metadata_value(err, METADATA_KEY)
    if kind and kind in BY_KIND:
        exc: ProviderError = BY_KIND[kind](err.details() or kind)  # type: ignore[attr-defined]
        return exc
    if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):  # type: ignore[attr-defined]
        return Transient(f"provisioner unreachable: {err.details()}")  # type: ignore[attr-defined]
    return grpcclient.wrap_rpc_error(err)


def _provisioner_unreachable(err: grpc.RpcError) -> bool:
    """Retry only when the provisioner itself was unreachable; a provider's own error
    (carried in the trailer) goes back to the caller, who decides."""
    unavailable = err.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]
    return unavailable and not grpcclient.metadata_value(err, METADATA_KEY)


class ProvisionerClient:
    """Every method raises a typed ProviderError (or Transient when the provisioner is down)."""

    def __init__(self, address: str, transport: Transport, timeout_s: float = 30.0) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._channel = grpcclient.open_channel(address, transport, Role.PROVISIONER)
        self._stub = provisioner_service_pb2_grpc.ProvisionerServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable[..., T], request: Message, idempotent: bool) -> T:
        return grpcclient.call(
            method,
            request,
            timeout=self.timeout_s,
            idempotent=idempotent,
            retryable=_provisioner_unreachable,
            wrap=_provider_error,
        )

    # Create/start/stop/destroy are idempotent by machine id and operation (the
    # provisioner derives the provider's idempotency key from them), so they may retry.
    def create(
        self, machine_id: str, offering: machine_pb2.Offering, request_id: str
    ) -> provisioner_service_pb2.Instance:
        req = provisioner_service_pb2.CreateInstanceRequest(
            request_id=request_id, machine_id=machine_id, offering=offering
        )
        instance: provisioner_service_pb2.Instance = self._call(
            self._stub.CreateInstance, req, idempotent=True
        )
        return instance

    def start(
        self, machine_id: str, offering: machine_pb2.Offering, provider_instance_id: str, request_id: str
    ) -> provisioner_service_pb2.Instance:
        req = provisioner_service_pb2.StartInstanceRequest(
            request_id=request_id,
            machine_id=machine_id,
            offering=offering,
            provider_instance_id=provider_instance_id,
        )
        instance: provisioner_service_pb2.Instance = self._call(
            self._stub.StartInstance, req, idempotent=True
        )
        return instance

    def stop(
        self, machine_id: str, offering: machine_pb2.Offering, provider_instance_id: str, request_id: str
    ) -> provisioner_service_pb2.Instance:
        req = provisioner_service_pb2.StopInstanceRequest(
            request_id=request_id,
            machine_id=machine_id,
            offering=offering,
            provider_instance_id=provider_instance_id,
        )
        instance: provisioner_service_pb2.Instance = self._call(self._stub.StopInstance, req, idempotent=True)
        return instance

    def destroy(
        self, machine_id: str, offering: machine_pb2.Offering, provider_instance_id: str, request_id: str
    ) -> bool:
        """Returns whether the instance existed; a missing instance is success."""
        req = provisioner_service_pb2.DestroyInstanceRequest(
            request_id=request_id,
            machine_id=machine_id,
            offering=offering,
            provider_instance_id=provider_instance_id,
        )
        resp: provisioner_service_pb2.DestroyInstanceResponse = self._call(
            self._stub.DestroyInstance, req, idempotent=True
        )
        return bool(resp.existed)

    def get(
        self, machine_id: str, offering: machine_pb2.Offering, provider_instance_id: str
    ) -> provisioner_service_pb2.Instance:
        req = provisioner_service_pb2.GetInstanceRequest(
            machine_id=machine_id, offering=offering, provider_instance_id=provider_instance_id
        )
        instance: provisioner_service_pb2.Instance = self._call(self._stub.GetInstance, req, idempotent=True)
        return instance

    def list_all(self, provider: Any = 0) -> tuple[list[provisioner_service_pb2.Instance], list[int]]:
        """Every instance labelled with our deployment, and the providers that could not be listed."""
        instances: list[provisioner_service_pb2.Instance] = []
        unreachable: list[int] = []
        token = ""
        while True:
            resp = self._call(
                self._stub.ListInstances,
                provisioner_service_pb2.ListInstancesRequest(
                    page_size=500, page_token=token, provider=provider
                ),
                idempotent=True,
            )
            instances.extend(resp.instances)
            unreachable.extend(p for p in resp.unreachable if p not in unreachable)
            token = resp.next_page_token
            if not token:
                return instances, unreachable

    def served_offering_ids(self) -> set[str]:
        """The ids of every catalogue offering this provisioner can serve (its configured
        providers): what the scheduler may create from."""
        served: set[str] = set()
        token = ""
        while True:
            resp = self._call(
                self._stub.ListOfferings,
                provisioner_service_pb2.ListOfferingsRequest(page_size=500, page_token=token),
                idempotent=True,
            )
            served.update(o.offering_id for o in resp.offerings)
            token = resp.next_page_token
            if not token:
                return served
