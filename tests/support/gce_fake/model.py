"""The fake's state: one GCP project's instances and zone operations, and the script.

Time comes from a :class:`~gpufleet.common.clock.Clock` (real by default). A change that
takes time (insert, start, stop, delete) is an operation that is ``RUNNING`` until its
latency has passed and then ``DONE``; meanwhile the instance shows GCE's intermediate
statuses (PROVISIONING and STAGING, STOPPING). Nothing runs in the background: every read
first *settles* what has finished by now.
"""

from __future__ import annotations

import itertools
import random
import re
import threading
import uuid
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpufleet.common.clock import Clock, RealClock
from tests.support.gce_fake import shapes

# What a machine type holds: (vCPUs, NVIDIA L4s). The g2 family and two plain types.
MACHINE_TYPES: dict[str, tuple[int, int]] = {
    "g2-standard-4": (4, 1),
    "g2-standard-8": (8, 1),
    "g2-standard-12": (12, 1),
    "g2-standard-16": (16, 1),
    "g2-standard-24": (24, 2),
    "g2-standard-32": (32, 1),
    "g2-standard-48": (48, 4),
    "g2-standard-96": (96, 8),
    "e2-standard-2": (2, 0),
    "n2-standard-4": (4, 0),
}
_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")

OpKind = str  # "insert" | "start" | "stop" | "resume" | "delete"


class HttpError(Exception):
    """An answer with an error status and GCE's error body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body


def _invalid(field: str, value: str, why: str) -> HttpError:
    return HttpError(400, shapes.invalid(field, value, why))


@dataclass(frozen=True)
class Latencies:
    """Seconds (of the fake's clock) each kind of operation takes."""

    insert: float = 0.0
    start: float = 0.0
    stop: float = 0.0
    delete: float = 0.0

    def of(self, kind: OpKind) -> float:
        return float(getattr(self, "start" if kind == "resume" else kind))


@dataclass
class FakeInstance:
    id: int
    name: str
    zone: str
    machine_type: str
    labels: dict[str, str]
    body: dict[str, Any]
    created: datetime
    network_ip: str
    status: str
    # Until each moment, the instance shows that status; then `status` (None: forever).
    phases: list[tuple[datetime | None, str]] = field(default_factory=list)
    last_start: datetime | None = None
    last_stop: datetime | None = None

    def shown_status(self, now: datetime) -> str:
        for until, status in self.phases:
            if until is None or now < until:
                return status
        return self.status


@dataclass
class FakeOperation:
    id: int
    name: str
    zone: str
    kind: OpKind
    target: str
    target_id: int
    request_id: str
    inserted: datetime
    done_at: datetime | None  # None: never finishes (scripted)
    error: dict[str, Any] | None = None
    http_status: int = 0
    # Applied once, when the operation finishes (e.g. a failed insert's instance vanishes).
    effect: Callable[[], None] | None = None
    finished: bool = False

    def status(self, now: datetime) -> str:
        if self.done_at is None or now < self.done_at:
            return "PENDING" if now <= self.inserted and self.done_at != self.inserted else "RUNNING"
        return "DONE"


@dataclass
class Script:
    """What the next requests will meet; see :class:`~tests.support.gce_fake.GceFake`."""

    # kind -> [status, reason, message, requests of that kind still let through]
    http_faults: dict[str, deque[list[Any]]] = field(default_factory=lambda: defaultdict(deque))
    operation_faults: dict[OpKind, deque[dict[str, Any]]] = field(default_factory=lambda: defaultdict(deque))
    drops: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    hanging: set[OpKind] = field(default_factory=set)
    stockouts: set[str] = field(default_factory=set)
    gpu_quota: dict[str, int] = field(default_factory=dict)  # region -> L4s allowed
    refuse_credentials: int = 0  # 0, or the status every request gets (401/403)
    # aggregatedList's view lags: instances inserted while lagging are not in it yet.
    lagging_lists: bool = False
    not_listed_yet: set[int] = field(default_factory=set)


class Project:
    """One project's instances and operations; every method holds the lock."""

    def __init__(
        self, project: str, zones: tuple[str, ...], clock: Clock | None, latencies: Latencies
    ) -> None:
        self.project = project
        self.zones = zones
        self.clock: Clock = clock or RealClock()
        self.latencies = latencies
        self.script = Script()
        self.lock = threading.RLock()
        self.instances: dict[tuple[str, str], FakeInstance] = {}
        self.operations: dict[str, FakeOperation] = {}
        self.by_request_id: dict[str, FakeOperation] = {}
        self._ids = itertools.count(random.randrange(10**18, 4 * 10**18))
        self._ips = itertools.count(2)

    # ---- time ---------------------------------------------------------------------------

    def settle(self) -> datetime:
        """Finish every operation whose time has come (in order); returns now."""
        now = self.clock.now()
        due = [op for op in self.operations.values() if not op.finished and op.done_at and op.done_at <= now]
        for op in sorted(due, key=lambda o: o.done_at or now):
            op.finished = True
            if op.effect is not None:
                op.effect()
        return now

    # ---- operations ---------------------------------------------------------------------

    def _operation(
        self, kind: OpKind, zone: str, inst: FakeInstance, request_id: str, *, instant: bool = False
    ) -> FakeOperation:
        now = self.clock.now()
        hang = kind in self.script.hanging and not instant
        delay = 0.0 if instant else self.latencies.of(kind)
        op = FakeOperation(
            id=next(self._ids),
            name=f"operation-{int(now.timestamp() * 1000)}-{uuid.uuid4().hex[:13]}-{uuid.uuid4().hex[:8]}",
            zone=zone,
            kind=kind,
            target=inst.name,
            target_id=inst.id,
            request_id=request_id,
            inserted=now,
            done_at=None if hang else now + timedelta(seconds=delay),
        )
        self.operations[op.name] = op
        if request_id:
            self.by_request_id[request_id] = op
        return op

    def _fail(self, op: FakeOperation, error: dict[str, Any], http_status: int) -> None:
        op.error, op.http_status = error, http_status

    def _scripted_failure(self, kind: OpKind, op: FakeOperation) -> bool:
        queue = self.script.operation_faults.get(kind)
        if not queue:
            return False
        fault = queue.popleft()
        self._fail(op, shapes.operation_error(fault["code"], fault["message"]), fault["http_status"])
        return True

    def operation(self, zone: str, name: str) -> FakeOperation:
        op = self.operations.get(name)
        if op is None or op.zone != zone:
            raise HttpError(404, shapes.not_found(self.project, f"zones/{zone}/operations/{name}"))
        return op

    # ---- instances ----------------------------------------------------------------------

    def check_zone(self, zone: str) -> None:
        if zone not in self.zones:
            raise HttpError(400, shapes.invalid("zone", zone, "Unknown zone."))

    def instance(self, zone: str, name: str) -> FakeInstance:
        self.check_zone(zone)
        inst = self.instances.get((zone, name))
        if inst is None:
            raise HttpError(404, shapes.not_found(self.project, f"zones/{zone}/instances/{name}"))
        return inst

    def _l4s_in(self, region: str) -> int:
        return sum(
            MACHINE_TYPES[i.machine_type][1]
            for i in self.instances.values()
            if i.zone.rsplit("-", 1)[0] == region and i.status != "TERMINATED"
        )

    def _validate_insert(self, zone: str, body: dict[str, Any]) -> tuple[str, str, dict[str, str]]:
        """What GCE refuses with 400 before creating anything (the rules the driver must meet)."""
        name = str(body.get("name", ""))
        if not _NAME.fullmatch(name):
            raise _invalid("resource.name", name, f"Must be a match of regex '{_NAME.pattern}'")
        machine_type = str(body.get("machineType", "")).rsplit("/", 1)[-1]
        if machine_type not in MACHINE_TYPES:
            why = f"Machine type with name '{machine_type}' does not exist in zone '{zone}'."
            raise _invalid("resource.machineType", str(body.get("machineType")), why)
        labels = {str(k): str(v) for k, v in (body.get("labels") or {}).items()}
        for key, value in labels.items():
            if not _LABEL_KEY.fullmatch(key) or not _LABEL_VALUE.fullmatch(value):
                why = "Label keys and values must be lowercase letters, digits, '_' or '-'."
                raise _invalid("resource.labels", f"{key}={value}", why)
        disks = body.get("disks") or []
        if not any(d.get("boot") and (d.get("initializeParams") or {}).get("sourceImage") for d in disks):
            raise _invalid("resource.disks", "", "A boot disk with a source image is required.")
        scheduling = body.get("scheduling") or {}
        maintenance = str(scheduling.get("onHostMaintenance", "MIGRATE"))
        if MACHINE_TYPES[machine_type][1] and maintenance != "TERMINATE":
            why = "Instances with guest accelerators do not support live migration."
            raise _invalid("resource.scheduling.onHostMaintenance", maintenance, why)
        if scheduling.get("provisioningModel") == "SPOT" and scheduling.get("automaticRestart", True):
            why = "Spot instances cannot restart automatically."
            raise _invalid("resource.scheduling.automaticRestart", "true", why)
        return name, machine_type, labels

    def insert(self, zone: str, body: dict[str, Any], request_id: str) -> FakeOperation:
        if request_id in self.by_request_id:
            return self.by_request_id[request_id]  # the same request again: nothing new
        self.check_zone(zone)
        name, machine_type, labels = self._validate_insert(zone, body)
        if (zone, name) in self.instances:
            raise HttpError(
                409,
                shapes.error_body(
                    409,
                    f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' already exists",
                ),
            )
        now = self.clock.now()
        n = next(self._ips)
        inst = FakeInstance(
            id=next(self._ids),
            name=name,
            zone=zone,
            machine_type=machine_type,
            labels=labels,
            body=body,
            created=now,
            network_ip=f"10.128.{n // 250}.{n % 250 + 2}",
            status="RUNNING",
            last_start=now,
        )
        region = zone.rsplit("-", 1)[0]
        gpus = MACHINE_TYPES[machine_type][1]
        limit = self.script.gpu_quota.get(region)
        if limit is not None and self._l4s_in(region) + gpus > limit:
            # Quota is checked before anything is made: the operation fails at once.
            op = self._operation("insert", zone, inst, request_id, instant=True)
            self._fail(op, shapes.quota_error("NVIDIA_L4_GPUS", region, float(limit)), 403)
            return op
        self.instances[(zone, name)] = inst
        if self.script.lagging_lists:
            self.script.not_listed_yet.add(inst.id)
        op = self._operation("insert", zone, inst, request_id)
        inst.phases = [
            (None if op.done_at is None else op.done_at - (op.done_at - now) / 2, "PROVISIONING"),
            (op.done_at, "STAGING"),
        ]

        def vanish() -> None:
            self.instances.pop((zone, name), None)

        if zone in self.script.stockouts:
            self._fail(op, shapes.stockout_error(self.project, zone, machine_type), 503)
            op.effect = vanish
        elif self._scripted_failure("insert", op):
            op.effect = vanish
        return op

    def start(self, zone: str, name: str, request_id: str, kind: OpKind = "start") -> FakeOperation:
        if request_id in self.by_request_id:
            return self.by_request_id[request_id]
        inst = self.instance(zone, name)
        now = self.settle()
        shown = inst.shown_status(now)
        if shown in ("STOPPING", "SUSPENDING"):
            raise HttpError(
                400,
                shapes.error_body(
                    400,
                    f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' is not ready",
                    "resourceNotReady",
                ),
            )
        if shown not in ("TERMINATED", "SUSPENDED"):
            return self._operation(kind, zone, inst, request_id, instant=True)
        op = self._operation(kind, zone, inst, request_id)
        if zone in self.script.stockouts:
            self._fail(op, shapes.stockout_error(self.project, zone, inst.machine_type), 503)
        elif not self._scripted_failure(kind, op):
            inst.status, inst.last_start = "RUNNING", now
            inst.phases = [(op.done_at, "STAGING")]
        return op

    def stop(self, zone: str, name: str, request_id: str) -> FakeOperation:
        if request_id in self.by_request_id:
            return self.by_request_id[request_id]
        inst = self.instance(zone, name)
        now = self.settle()
        if inst.shown_status(now) in ("TERMINATED", "STOPPING"):
            return self._operation("stop", zone, inst, request_id, instant=True)
        op = self._operation("stop", zone, inst, request_id)
        if not self._scripted_failure("stop", op):
            inst.status, inst.last_stop = "TERMINATED", op.done_at or now
            inst.phases = [(op.done_at, "STOPPING")]
        return op

    def delete(self, zone: str, name: str, request_id: str) -> FakeOperation:
        if request_id in self.by_request_id:
            return self.by_request_id[request_id]
        inst = self.instance(zone, name)
        op = self._operation("delete", zone, inst, request_id)
        if not self._scripted_failure("delete", op):
            inst.phases = [(op.done_at, "STOPPING")]

            def gone() -> None:
                if self.instances.get((zone, name)) is inst:
                    del self.instances[(zone, name)]

            op.effect = gone
        return op

    def plant(
        self, zone: str, name: str, labels: dict[str, str], machine_type: str, status: str, spot: bool
    ) -> FakeInstance:
        """An instance made by someone else (another deployment, a person at the console)."""
        self.check_zone(zone)
        now = self.clock.now()
        scheduling = {"provisioningModel": "SPOT" if spot else "STANDARD", "onHostMaintenance": "TERMINATE"}
        inst = FakeInstance(
            id=next(self._ids),
            name=name,
            zone=zone,
            machine_type=machine_type,
            labels=dict(labels),
            body={"scheduling": scheduling},
            created=now,
            network_ip=f"10.132.0.{next(self._ips) % 250 + 2}",
            status=status,
            last_start=now,
        )
        self.instances[(zone, name)] = inst
        return inst

    def preempt(self, zone: str, name: str) -> None:
        """GCE reclaims a spot instance: with instanceTerminationAction=STOP it is TERMINATED."""
        inst = self.instance(zone, name)
        inst.status, inst.phases, inst.last_stop = "TERMINATED", [], self.clock.now()
