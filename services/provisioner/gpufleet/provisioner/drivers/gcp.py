"""The gcp driver: NVIDIA L4 machines (the g2-standard family) on Compute Engine.

Through google-cloud-compute's REST transport. How it keeps the Driver contract:

- **create** first lists-and-adopts by the ``gpufleet-machine`` label (aggregatedList, every
  zone), then inserts ``gf-<machine id>`` with a ``requestId`` derived from the machine id
  and the operation, so a retried insert after a lost answer is the same request to GCE;
  and since the name is fixed, an insert under any other key meets the name taken (409)
  and adopts what it finds — GCE itself never holds two instances for one machine.
- **start/stop/delete** read the instance first and act only on ours (both labels, and the
  provider id when the caller gave one); their keys name the occurrence (a start carries
  the instance's last stop time), so retrying one is safe and the next one is new.
- **request ids and retries after a failure**: GCE answers a request id it has seen with
  that request's operation, failed or not, for as long as it remembers it. So a key also
  names a window of the clock (``request_id_window_s``): within it a retry is the same
  request (a lost answer costs nothing); after it, trying again is a new request, and a
  machine whose start met a stockout can start once the zone has GPUs again. A create in
  another zone is always a new request.
- **long operations** are waited on by :class:`~.gcp_operations.OperationWaiter`: bounded,
  ``NotYetDone`` when the bound passes; an operation's errors are classified like an HTTP
  error's (a stockout arrives as an operation error).
- **list** is one aggregatedList across all zones, paged, filtered server-side by the
  deployment label and checked again here.
- **errors** become typed errors in :mod:`~.gcp_errors`, from their codes only.

Reads (get, list, operation polls) carry a short explicit retry policy and a timeout: the
SDK's defaults retry 503s for minutes. Mutations are not retried by the SDK — the caller
retries with the same key. Credentials are whatever the clients were built with (the
factory uses the SDK's standard chain); this module never reads one.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.api_core import retry as api_retry
from google.cloud import compute_v1

from gpufleet.common.clock import Clock
from gpufleet.common.errors import AlreadyExists, InvalidArgument
from gpufleet.common.provider_errors import InstanceNotFound, NotYetDone, Transient
from gpufleet.common.trust.pki import MachineIssuer, machine_credential
from gpufleet.provisioner.drivers.base import (
    DEPLOYMENT_LABEL,
    MACHINE_LABEL,
    InstanceInfo,
    InstanceRef,
    InstanceSpec,
    InstanceStatus,
    Provider,
    idempotency_key,
    instance_labels,
)
from gpufleet.provisioner.drivers.gcp_errors import classify, failure_of_operation, translate
from gpufleet.provisioner.drivers.gcp_instances import (
    L4_MACHINE_TYPES,
    Recipe,
    check_label_value,
    instance_body,
    instance_name,
    to_info,
)
from gpufleet.provisioner.drivers.gcp_operations import OperationWaiter

__all__ = ["GcpClients", "GcpDriver", "GcpOptions"]

log = logging.getLogger(__name__)

_RETRYABLE = (
    api_exceptions.TooManyRequests,
    api_exceptions.InternalServerError,
    api_exceptions.BadGateway,
    api_exceptions.ServiceUnavailable,
    api_exceptions.GatewayTimeout,
)


@dataclass(frozen=True)
class GcpClients:
    """The two REST clients the driver uses, built once and shared."""

    instances: Any  # compute_v1.InstancesClient
    operations: Any  # compute_v1.ZoneOperationsClient

    @classmethod
    def connect(cls, api_endpoint: str | None = None, credentials: Any = None) -> GcpClients:
        """Clients on Google's endpoint (or ``api_endpoint``, e.g. an emulator's http URL).

        ``credentials=None`` means the SDK's standard chain (application default
        credentials); tests pass ``AnonymousCredentials()`` explicitly.
        """
        options = {"api_endpoint": api_endpoint} if api_endpoint else None
        return cls(
            instances=compute_v1.InstancesClient(
                transport="rest", client_options=options, credentials=credentials
            ),
            operations=compute_v1.ZoneOperationsClient(
                transport="rest", client_options=options, credentials=credentials
            ),
        )


@dataclass(frozen=True)
class GcpOptions:
    """Where machines go and how long to wait; see the provisioner's ``gcp_*`` settings."""

    project: str
    recipe: Recipe
    zones: tuple[str, ...] = ()
    operation_wait_s: float = 120.0
    operation_poll_s: float = 20.0
    request_timeout_s: float = 30.0
    read_retry_s: float = 5.0
    page_size: int = 500
    request_id_window_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.project:
            raise ValueError("the GCP driver needs a project (GPUFLEET_GCP_PROJECT)")
        if not self.recipe.image:
            raise ValueError("the GCP driver needs a boot image for its machines (GPUFLEET_GCP_IMAGE)")


class GcpDriver:
    """The :class:`~gpufleet.provisioner.drivers.base.Driver` for Compute Engine."""

    provider = Provider.GCP

    def __init__(
        self,
        clients: GcpClients,
        deployment_id: str,
        clock: Clock,
        options: GcpOptions,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        machine_issuer: MachineIssuer | None = None,
    ) -> None:
        check_label_value(deployment_id, "deployment_id")
        self.machine_issuer = machine_issuer
        self.clients = clients
        self.deployment_id = deployment_id
        self.clock = clock
        self.options = options
        self.waiter = OperationWaiter(
            self._poll,
            clock,
            wait_s=options.operation_wait_s,
            poll_s=options.operation_poll_s,
            monotonic=monotonic,
        )

    # ---- the Driver contract -------------------------------------------------------------

    def create(self, spec: InstanceSpec) -> InstanceInfo:
        machine_id = check_label_value(spec.machine_id, "machine_id")
        zone = self._zone_for_create(spec)
        existing = self._find_by_label(machine_id)
        if existing is not None:
            log.info("adopting GCE instance %s for machine %s", existing.name, machine_id)
            return self._info(existing)
        name = instance_name(machine_id)
        labels = instance_labels(self.deployment_id, machine_id, spec.labels)
        body = instance_body(
            name,
            spec,
            labels,
            self.options.recipe,
            self.deployment_id,
            machine_credential(self.machine_issuer, machine_id),
        )
        request = compute_v1.InsertInstanceRequest(
            project=self.options.project,
            zone=zone,
            instance_resource=body,
            request_id=self._key(machine_id, f"create:{zone}"),
        )
        try:
            with self._errors(about_instance=False, mutation=True):
                op = self.clients.instances.insert_unary(
                    request=request, retry=None, timeout=self.options.request_timeout_s
                )
        except AlreadyExists:
            # The name is taken: ours from an earlier try under another key, or not ours.
            taken = self._get_named(zone, name)
            if taken is None or not self._ours(taken, machine_id):
                raise AlreadyExists(
                    f"GCE instance {name} in {zone} exists and is not machine {machine_id}'s"
                ) from None
            return self._info(taken)
        self._finish(op, zone, f"create {name}", about_instance=False)
        created = self._get_named(zone, name)
        if created is None:
            raise Transient(f"GCE finished creating {name} in {zone} but does not show it yet")
        return self._info(created)

    def start(self, ref: InstanceRef) -> InstanceInfo:
        inst = self._require(ref)
        status = self._status(inst)
        if status in (InstanceStatus.PENDING, InstanceStatus.RUNNING):
            return self._info(inst)
        if status is InstanceStatus.STOPPING:
            raise Transient(f"GCE instance {inst.name} is still {inst.status}")
        zone = _last(inst.zone)
        # One key per stopped period: a retried start repeats it, the next start is new.
        since = inst.last_suspended_timestamp if inst.status == "SUSPENDED" else inst.last_stop_timestamp
        key = self._key(ref.machine_id, f"start:{inst.id}:{since}")
        args = {"project": self.options.project, "zone": zone, "instance": inst.name, "request_id": key}
        with self._errors(mutation=True):
            if inst.status == "SUSPENDED":
                request: Any = compute_v1.ResumeInstanceRequest(**args)
                op = self.clients.instances.resume_unary(request=request, retry=None, timeout=self._timeout)
            else:
                request = compute_v1.StartInstanceRequest(**args)
                op = self.clients.instances.start_unary(request=request, retry=None, timeout=self._timeout)
        self._finish(op, zone, f"start {inst.name}")
        return self._info(self._require(ref))

    def stop(self, ref: InstanceRef) -> InstanceInfo:
        inst = self._require(ref)
        if self._status(inst) in (InstanceStatus.STOPPING, InstanceStatus.STOPPED):
            return self._info(inst)
        zone = _last(inst.zone)
        since = inst.last_start_timestamp or inst.creation_timestamp
        request = compute_v1.StopInstanceRequest(
            project=self.options.project,
            zone=zone,
            instance=inst.name,
            request_id=self._key(ref.machine_id, f"stop:{inst.id}:{since}"),
        )
        with self._errors(mutation=True):
            op = self.clients.instances.stop_unary(request=request, retry=None, timeout=self._timeout)
        self._finish(op, zone, f"stop {inst.name}")
        return self._info(self._require(ref))

    def destroy(self, ref: InstanceRef) -> bool:
        inst = self._find(ref)
        if inst is None:
            return False
        zone = _last(inst.zone)
        request = compute_v1.DeleteInstanceRequest(
            project=self.options.project,
            zone=zone,
            instance=inst.name,
            request_id=self._key(ref.machine_id, f"destroy:{inst.id}"),
        )
        try:
            with self._errors(mutation=True):
                op = self.clients.instances.delete_unary(request=request, retry=None, timeout=self._timeout)
            self._finish(op, zone, f"delete {inst.name}")
        except InstanceNotFound:
            # GCE itself says there is no such instance: gone is done (no second read).
            log.info("GCE instance %s vanished while we deleted it", inst.name)
            return True
        self._confirm_deleted(zone, inst)
        return True

    def _confirm_deleted(self, zone: str, deleted: Any) -> None:
        """The second read after a delete: ``NotYetDone`` while GCE still shows the
        instance (its delete still STOPPING it, or an answer that outran the deletion); a
        404 — or a new instance under the same name, which is not the one deleted — is done."""
        inst = self._get_named(zone, deleted.name)
        if inst is not None and inst.id == deleted.id:
            raise NotYetDone(
                f"GCE accepted the delete of {deleted.name} but still shows it {inst.status}; "
                "not destroyed until GCE no longer has it"
            )

    def get(self, ref: InstanceRef) -> InstanceInfo:
        return self._info(self._require(ref))

    def list(self) -> builtins.list[InstanceInfo]:
        return [self._info(i) for i in self._aggregated(self._label_filter())]

    # ---- finding instances ---------------------------------------------------------------

    def _key(self, machine_id: str, operation: str) -> str:
        """The requestId of ``operation`` on ``machine_id`` in this window of the clock."""
        window = int(self.clock.now().timestamp() // self.options.request_id_window_s)
        return idempotency_key(machine_id, f"{operation}@{window}")

    @property
    def _timeout(self) -> float:
        return self.options.request_timeout_s

    def _read_retry(self) -> api_retry.Retry | None:
        if self.options.read_retry_s <= 0:
            return None
        return api_retry.Retry(
            predicate=api_retry.if_exception_type(*_RETRYABLE),
            initial=0.1,
            maximum=1.0,
            multiplier=2.0,
            timeout=self.options.read_retry_s,
        )

    def _ours(self, inst: Any, machine_id: str) -> bool:
        labels = inst.labels
        return bool(
            labels.get(DEPLOYMENT_LABEL) == self.deployment_id and labels.get(MACHINE_LABEL) == machine_id
        )

    def _get_named(self, zone: str, name: str) -> Any | None:
        """The instance ``name`` in ``zone``, whoever's it is; None when there is none."""
        try:
            with self._errors():
                return self.clients.instances.get(
                    project=self.options.project,
                    zone=zone,
                    instance=name,
                    retry=self._read_retry(),
                    timeout=self._timeout,
                )
        except InstanceNotFound:
            return None

    def _find(self, ref: InstanceRef) -> Any | None:
        """Our instance for ``ref``: in the offering's zone by its derived name (or, with no
        zone given, by its machine label anywhere), labelled ours, and the instance the
        caller named when it named one."""
        if ref.offering.zone:
            inst = self._get_named(ref.offering.zone, instance_name(ref.machine_id))
            inst = inst if inst is not None and self._ours(inst, ref.machine_id) else None
        else:
            inst = self._find_by_label(ref.machine_id)
        if inst is None or (ref.provider_instance_id and str(inst.id) != ref.provider_instance_id):
            return None
        return inst

    def _require(self, ref: InstanceRef) -> Any:
        inst = self._find(ref)
        if inst is None:
            raise InstanceNotFound(
                f"no GCE instance for machine {ref.machine_id} in deployment {self.deployment_id}"
            )
        return inst

    def _find_by_label(self, machine_id: str) -> Any | None:
        found = [i for i in self._aggregated(self._label_filter(machine_id)) if self._ours(i, machine_id)]
        if len(found) > 1:
            log.warning(
                "machine %s has %d GCE instances: %s", machine_id, len(found), [i.name for i in found]
            )
        return found[0] if found else None

    def _label_filter(self, machine_id: str = "") -> str:
        parts = [f'(labels.{DEPLOYMENT_LABEL} = "{self.deployment_id}")']
        if machine_id:
            parts.append(f'(labels.{MACHINE_LABEL} = "{machine_id}")')
        return " AND ".join(parts)

    def _aggregated(self, filter_: str) -> builtins.list[Any]:
        """Every instance of the project matching ``filter_``, all zones, all pages — and
        only those that really carry our deployment label, whatever the server filtered."""
        request = compute_v1.AggregatedListInstancesRequest(
            project=self.options.project, filter=filter_, max_results=self.options.page_size
        )
        found: builtins.list[Any] = []
        with self._errors():
            pager = self.clients.instances.aggregated_list(
                request=request, retry=self._read_retry(), timeout=self._timeout
            )
            for _scope, scoped in pager:
                found.extend(scoped.instances)
        return [i for i in found if i.labels.get(DEPLOYMENT_LABEL) == self.deployment_id]

    # ---- operations ------------------------------------------------------------------------

    def _poll(self, zone: str, operation: str, hold_s: float) -> Any | None:
        """One bounded poll (zoneOperations.wait holds until done or ``hold_s``)."""
        retry = api_retry.Retry(
            predicate=api_retry.if_exception_type(*_RETRYABLE),
            initial=0.1,
            maximum=1.0,
            multiplier=2.0,
            timeout=hold_s,
        )
        try:
            with self._errors():
                return self.clients.operations.wait(
                    project=self.options.project, zone=zone, operation=operation, retry=retry, timeout=hold_s
                )
        except Transient:
            return None  # no answer in time: still unknown, the waiter decides
        except InstanceNotFound:
            raise NotYetDone(f"GCE no longer knows operation {operation}; its outcome is unknown") from None

    def _finish(self, op: Any, zone: str, what: str, *, about_instance: bool = True) -> None:
        done = self.waiter.wait(op, zone, what)
        if done.error.errors:
            raise classify(failure_of_operation(done), about_instance=about_instance)

    # ---- helpers -------------------------------------------------------------------------

    def _zone_for_create(self, spec: InstanceSpec) -> str:
        offering = spec.offering
        if offering.instance_type not in L4_MACHINE_TYPES:
            raise InvalidArgument(
                f"{offering.instance_type!r} is not an L4 machine type ({', '.join(L4_MACHINE_TYPES)})",
                field="offering.instance_type",
            )
        if offering.gpu_count and offering.gpu_count != L4_MACHINE_TYPES[offering.instance_type]:
            raise InvalidArgument(
                f"{offering.instance_type} has {L4_MACHINE_TYPES[offering.instance_type]} L4, "
                f"not {offering.gpu_count}",
                field="offering.gpu_count",
            )
        if not offering.zone:
            raise InvalidArgument("is required to create an instance", field="offering.zone")
        if self.options.zones and offering.zone not in self.options.zones:
            raise InvalidArgument(
                f"zone {offering.zone} is not one this provisioner uses ({', '.join(self.options.zones)})",
                field="offering.zone",
            )
        return offering.zone

    def _status(self, inst: Any) -> InstanceStatus:
        return self._info(inst).status

    def _info(self, inst: Any) -> InstanceInfo:
        return to_info(inst, self.options.recipe.agent_port)

    @contextlib.contextmanager
    def _errors(self, *, about_instance: bool = True, mutation: bool = False) -> Iterator[None]:
        """Turn an SDK exception into its typed error; anything else stays unexpected."""
        try:
            yield
        except Exception as exc:
            typed = translate(exc, about_instance=about_instance, mutation=mutation)
            if typed is None:
                raise
            raise typed from exc


def _last(url: str) -> str:
    return url.rsplit("/", 1)[-1]
