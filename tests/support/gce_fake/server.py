"""The fake's HTTP side: Compute Engine v1 REST routes on 127.0.0.1, and its script.

Routes (what google-cloud-compute's REST transport calls)::

    POST   /compute/v1/projects/{p}/zones/{z}/instances?requestId=        insert
    GET    /compute/v1/projects/{p}/zones/{z}/instances/{name}            get
    POST   /compute/v1/projects/{p}/zones/{z}/instances/{name}/start      start (?requestId=)
    POST   /compute/v1/projects/{p}/zones/{z}/instances/{name}/stop       stop
    POST   /compute/v1/projects/{p}/zones/{z}/instances/{name}/resume     resume
    DELETE /compute/v1/projects/{p}/zones/{z}/instances/{name}            delete
    GET    /compute/v1/projects/{p}/aggregated/instances                  filter, maxResults, pageToken
    GET    /compute/v1/projects/{p}/zones/{z}/operations/{op}             zoneOperations.get
    POST   /compute/v1/projects/{p}/zones/{z}/operations/{op}/wait        zoneOperations.wait

Request kinds (for faults and the request log): insert, get, start, stop, resume, delete,
aggregatedList, operations.get, operations.wait.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpufleet.common.clock import Clock
from tests.support.gce_fake import shapes
from tests.support.gce_fake.model import (
    MACHINE_TYPES,
    FakeInstance,
    FakeOperation,
    HttpError,
    Latencies,
    Project,
)

_P = r"/compute/v1/projects/(?P<project>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(_P + r"/zones/(?P<zone>[^/]+)/instances"), "insert"),
    ("GET", re.compile(_P + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)"), "get"),
    ("DELETE", re.compile(_P + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)"), "delete"),
    (
        "POST",
        re.compile(_P + r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)/(?P<action>start|stop|resume)"),
        "action",
    ),
    ("GET", re.compile(_P + r"/aggregated/instances"), "aggregatedList"),
    ("GET", re.compile(_P + r"/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)"), "operations.get"),
    ("POST", re.compile(_P + r"/zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)/wait"), "operations.wait"),
]
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    kind: str
    path: str
    query: dict[str, str]
    body: dict[str, Any] | None


class _Dropped(Exception):
    """The work is done, but the answer is lost on the way (the connection just closes)."""


class GceFake:
    """A Compute Engine REST fake for one project. Use as a context manager, or start()/stop().

    ``wait_cap_s`` is how long ``operations/{op}/wait`` holds an unfinished operation (real
    GCE: about two minutes) before answering with it as it is.
    """

    def __init__(
        self,
        project: str = "gpufleet-test",
        zones: tuple[str, ...] = ("us-central1-a", "us-central1-b", "europe-west4-a", "asia-southeast1-b"),
        *,
        clock: Clock | None = None,
        latencies: Latencies | None = None,
        wait_cap_s: float = 0.5,
    ) -> None:
        self.state = Project(project, tuple(zones), clock, latencies or Latencies())
        self.wait_cap_s = wait_cap_s
        self.requests: list[RecordedRequest] = []
        # Instance name -> released: its delete requests wait (unanswered) until set.
        self._held_deletes: dict[str, threading.Event] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def project(self) -> str:
        return self.state.project

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start the fake first"
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> GceFake:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="gce-fake", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> GceFake:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the script -------------------------------------------------------------------

    def fail_next(
        self,
        kind: str,
        status: int,
        reason: str | None = None,
        *,
        message: str = "",
        times: int = 1,
        after: int = 0,
    ) -> None:
        """After letting ``after`` requests of ``kind`` (or ``"any"``) through, the next
        ``times`` answer ``status`` with GCE's error body; ``reason`` defaults to GCE's for
        the status (404 notFound, 503 backendError, 429 rateLimitExceeded...)."""
        with self.state.lock:
            queue = self.state.script.http_faults[kind]
            queue.extend([[status, reason, message, after if n == 0 else 0] for n in range(times)])

    def fail_next_operation(self, kind: str, code: str, *, http_status: int, message: str = "") -> None:
        """The next operation of ``kind`` (insert/start/stop/delete) finishes DONE with ``code``."""
        with self.state.lock:
            self.state.script.operation_faults[kind].append(
                {"code": code, "http_status": http_status, "message": message or f"{code} (scripted)"}
            )

    def hang_operations(self, kind: str, hang: bool = True) -> None:
        """Operations of ``kind`` begun from now on never finish."""
        with self.state.lock:
            (self.state.script.hanging.add if hang else self.state.script.hanging.discard)(kind)

    def drop_next_response(self, kind: str) -> None:
        """The next request of ``kind`` is carried out, but its answer never arrives."""
        with self.state.lock:
            self.state.script.drops[kind] += 1

    def set_stockout(self, zone: str, out: bool = True) -> None:
        """Inserts and starts in ``zone`` fail as GCE's do: a ZONE_RESOURCE_POOL_EXHAUSTED operation error."""
        with self.state.lock:
            (self.state.script.stockouts.add if out else self.state.script.stockouts.discard)(zone)

    def set_gpu_quota(self, region: str, l4s: int) -> None:
        """At most ``l4s`` L4s may run in ``region``; beyond, an insert fails with QUOTA_EXCEEDED."""
        with self.state.lock:
            self.state.script.gpu_quota[region] = l4s

    def hold_deletes_of(self, name: str) -> None:
        """A delete request of instance ``name`` is not answered (nor carried out) until
        :meth:`release_deletes` — a call that hangs at the API, as one stuck delete did for
        weeks at Karpenter (#2077). Other requests are served meanwhile."""
        with self.state.lock:
            self._held_deletes.setdefault(name, threading.Event())

    def release_deletes(self) -> None:
        with self.state.lock:
            held = list(self._held_deletes.values())
            self._held_deletes.clear()
        for released in held:
            released.set()

    def finish_operations(self, kind: str) -> None:
        """Operations of ``kind`` that were hanging finish now (and new ones no longer hang)."""
        with self.state.lock:
            self.state.script.hanging.discard(kind)
            now = self.state.clock.now()
            for op in self.state.operations.values():
                if op.kind == kind and op.done_at is None:
                    op.done_at = now
            self.state.settle()

    def lag_lists(self, lag: bool = True) -> None:
        """While on, an instance inserted is not in aggregatedList answers until
        :meth:`catch_up_lists` — GCE's list is served from a view that can trail a create by
        seconds, while ``instances.get`` of the instance by name answers at once."""
        with self.state.lock:
            self.state.script.lagging_lists = lag

    def catch_up_lists(self) -> None:
        """aggregatedList shows every instance inserted so far."""
        with self.state.lock:
            self.state.script.not_listed_yet.clear()

    def refuse_credentials(self, status: int = 401) -> None:
        """Every request answers ``status`` (401: no valid credentials; 403: no permission); 0 ends it."""
        with self.state.lock:
            self.state.script.refuse_credentials = status

    def plant(
        self,
        zone: str,
        name: str,
        labels: dict[str, str],
        *,
        machine_type: str = "g2-standard-8",
        status: str = "RUNNING",
        spot: bool = False,
    ) -> dict[str, Any]:
        """An instance someone else made; returns it as the API shows it."""
        with self.state.lock:
            return self._instance_json(self.state.plant(zone, name, labels, machine_type, status, spot))

    def preempt(self, zone: str, name: str) -> None:
        with self.state.lock:
            self.state.preempt(zone, name)

    def instances(self) -> list[dict[str, Any]]:
        """Every instance in the project as the API shows it (for assertions)."""
        with self.state.lock:
            self.state.settle()
            return [self._instance_json(i) for i in self.state.instances.values()]

    def operations(self, kind: str = "") -> list[dict[str, Any]]:
        """Every operation (of ``kind``: insert, start, stop, resume, delete) as the API shows it."""
        with self.state.lock:
            self.state.settle()
            ops = sorted(self.state.operations.values(), key=lambda o: (o.inserted, o.id))
            return [self._operation_json(o) for o in ops if not kind or o.kind == kind]

    def requests_of(self, kind: str) -> list[RecordedRequest]:
        with self.state.lock:
            return [r for r in self.requests if r.kind == kind]

    # ---- JSON ---------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        return f"{shapes.BASE}/projects/{self.project}/{path}"

    def _instance_json(self, inst: FakeInstance) -> dict[str, Any]:
        now = self.state.clock.now()
        body = inst.body
        zone_path = f"zones/{inst.zone}"
        nics = body.get("networkInterfaces") or [{}]
        gpus = MACHINE_TYPES.get(inst.machine_type, (0, 0))[1]
        out: dict[str, Any] = {
            "kind": "compute#instance",
            "id": str(inst.id),
            "creationTimestamp": shapes.rfc3339(inst.created),
            "name": inst.name,
            "machineType": self._url(f"{zone_path}/machineTypes/{inst.machine_type}"),
            "status": inst.shown_status(now),
            "zone": self._url(zone_path),
            "networkInterfaces": [
                {
                    "kind": "compute#networkInterface",
                    "network": self._url(
                        str(nics[0].get("network") or "global/networks/default").split("projects/")[-1]
                    ),
                    "networkIP": inst.network_ip,
                    "name": "nic0",
                    "stackType": "IPV4_ONLY",
                    **({"accessConfigs": nics[0]["accessConfigs"]} if nics[0].get("accessConfigs") else {}),
                }
            ],
            "disks": [
                {
                    "kind": "compute#attachedDisk",
                    "type": "PERSISTENT",
                    "mode": "READ_WRITE",
                    "source": self._url(f"{zone_path}/disks/{inst.name}"),
                    "deviceName": "persistent-disk-0",
                    "index": 0,
                    "boot": True,
                    "autoDelete": True,
                    "interface": "SCSI",
                }
            ],
            "scheduling": body.get("scheduling") or {},
            "selfLink": self._url(f"{zone_path}/instances/{inst.name}"),
            "labels": dict(inst.labels),
            "labelFingerprint": base64.b64encode(
                json.dumps(inst.labels, sort_keys=True).encode()[:8]
            ).decode(),
        }
        if body.get("metadata"):
            out["metadata"] = {"kind": "compute#metadata", **body["metadata"]}
        if gpus:
            out["guestAccelerators"] = [
                {
                    "acceleratorType": self._url(f"{zone_path}/acceleratorTypes/nvidia-l4"),
                    "acceleratorCount": gpus,
                }
            ]
        if inst.last_start is not None:
            out["lastStartTimestamp"] = shapes.rfc3339(inst.last_start)
        if inst.last_stop is not None and inst.last_stop <= now:
            out["lastStopTimestamp"] = shapes.rfc3339(inst.last_stop)
        return out

    def _operation_json(self, op: FakeOperation) -> dict[str, Any]:
        now = self.state.clock.now()
        status = op.status(now)
        zone_path = f"zones/{op.zone}"
        out: dict[str, Any] = {
            "kind": "compute#operation",
            "id": str(op.id),
            "name": op.name,
            "zone": self._url(zone_path),
            "operationType": op.kind,
            "targetLink": self._url(f"{zone_path}/instances/{op.target}"),
            "targetId": str(op.target_id),
            "status": status,
            "user": "gpufleet-provisioner@example.iam.gserviceaccount.com",
            "progress": 100 if status == "DONE" else 0,
            "insertTime": shapes.rfc3339(op.inserted),
            "startTime": shapes.rfc3339(op.inserted),
            "selfLink": self._url(f"{zone_path}/operations/{op.name}"),
        }
        if status == "DONE":
            out["endTime"] = shapes.rfc3339(op.done_at or now)
            if op.error is not None:
                out["error"] = op.error
                out["httpErrorStatusCode"] = op.http_status
                out["httpErrorMessage"] = shapes.HTTP_MESSAGES.get(op.http_status, "ERROR")
        return out

    def _aggregated(self, query: dict[str, str]) -> dict[str, Any]:
        terms = shapes.parse_filter(query.get("filter", ""))
        if terms is None:
            raise HttpError(
                400, shapes.invalid("filter", query.get("filter", ""), "Invalid list filter expression.")
            )
        size = int(query.get("maxResults") or 500)
        if not 0 < size <= 500:
            raise HttpError(400, shapes.invalid("maxResults", str(size), "Must be between 0 and 500."))
        lagging = self.state.script.not_listed_yet
        found = [
            self._instance_json(i)
            for i in sorted(self.state.instances.values(), key=lambda i: (i.zone, i.name))
            if i.id not in lagging
        ]
        found = [i for i in found if all(t.matches(i) for t in terms)]
        start = 0
        if query.get("pageToken"):
            try:
                token = json.loads(base64.urlsafe_b64decode(query["pageToken"]))
                start = int(token["offset"]) if token["filter"] == query.get("filter", "") else -1
            except (ValueError, KeyError, TypeError):
                start = -1
            if start < 0:
                raise HttpError(400, shapes.invalid("pageToken", query["pageToken"], "Invalid page token."))
        page = found[start : start + size]
        items: dict[str, Any] = {}
        for zone in self.state.zones:
            scope = f"zones/{zone}"
            here = [i for i in page if i["zone"].endswith(f"/{scope}")]
            items[scope] = {"instances": here} if here else {"warning": shapes.no_results_warning(scope)}
        out: dict[str, Any] = {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{self.project}/aggregated/instances",
            "items": items,
            "selfLink": self._url("aggregated/instances"),
        }
        if start + size < len(found):
            token = json.dumps({"offset": start + size, "filter": query.get("filter", "")})
            out["nextPageToken"] = base64.urlsafe_b64encode(token.encode()).decode()
        return out

    # ---- requests -----------------------------------------------------------------------

    def handle(
        self, method: str, path: str, query: dict[str, str], body: dict[str, Any] | None
    ) -> tuple[int, Any]:
        route = next(
            ((kind, m) for verb, rx, kind in _ROUTES if verb == method and (m := rx.fullmatch(path))), None
        )
        if route is None:
            return 404, shapes.error_body(404, f"The requested URL {path} was not found on this server.")
        kind, match = route
        args = match.groupdict()
        if kind == "action":
            kind = args["action"]
        with self.state.lock:
            self.requests.append(RecordedRequest(method, kind, path, query, body))
        if kind == "operations.wait":
            self._hold(args["zone"], args["op"])
        if kind == "delete":
            with self.state.lock:
                held = self._held_deletes.get(args.get("name", ""))
            if held is not None:
                held.wait(300)
        with self.state.lock:
            script = self.state.script
            if script.refuse_credentials:
                status = script.refuse_credentials
                reason = "forbidden" if status == 403 else "required"
                return status, shapes.error_body(
                    status, "The caller does not have valid credentials or permission", reason
                )
            for key in (kind, "any"):
                queue = script.http_faults.get(key)
                if queue and queue[0][3] > 0:
                    queue[0][3] -= 1
                elif queue:
                    status, fault_reason, message, _ = queue.popleft()
                    return status, shapes.error_body(status, message or f"scripted {status}", fault_reason)
            if args["project"] != self.project:
                return 404, shapes.not_found(args["project"], "")
            self.state.settle()
            try:
                answer = self._route(kind, args, query, body or {})
            except HttpError as err:
                return err.status, err.body
            if script.drops.get(kind):
                script.drops[kind] -= 1
                raise _Dropped
            return 200, answer

    def _route(self, kind: str, args: dict[str, str], query: dict[str, str], body: dict[str, Any]) -> Any:
        state = self.state
        request_id = query.get("requestId", "")
        if request_id and not _UUID.fullmatch(request_id):
            raise HttpError(400, shapes.invalid("requestId", request_id, "Must be a UUID."))
        zone, name = args.get("zone", ""), args.get("name", "")
        if kind == "insert":
            return self._operation_json(state.insert(zone, body, request_id))
        if kind == "get":
            return self._instance_json(state.instance(zone, name))
        if kind in ("start", "resume"):
            return self._operation_json(state.start(zone, name, request_id, kind))
        if kind == "stop":
            return self._operation_json(state.stop(zone, name, request_id))
        if kind == "delete":
            return self._operation_json(state.delete(zone, name, request_id))
        if kind == "aggregatedList":
            return self._aggregated(query)
        return self._operation_json(state.operation(zone, args["op"]))  # operations.get / .wait

    def _hold(self, zone: str, name: str) -> None:
        """operations.wait: hold (outside the lock) until the operation is done or the cap passes."""
        end = time.monotonic() + self.wait_cap_s
        pause = threading.Event()
        while time.monotonic() < end:
            with self.state.lock:
                self.state.settle()
                op = self.state.operations.get(name)
                if op is None or op.zone != zone or op.status(self.state.clock.now()) == "DONE":
                    return
            pause.wait(0.01)


class _Handler(BaseHTTPRequestHandler):
    fake: GceFake
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw.strip() else None
        except ValueError:
            self._answer(400, shapes.error_body(400, "Invalid JSON payload received.", "parseError"))
            return
        try:
            status, answer = self.fake.handle(self.command, split.path, query, body)
        except _Dropped:
            self.close_connection = True
            return
        self._answer(status, answer)

    def _answer(self, status: int, answer: Any) -> None:
        payload = json.dumps(answer).encode()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    do_GET = do_POST = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        return


@contextlib.contextmanager
def running(**kwargs: Any) -> Iterator[GceFake]:
    """``with running() as fake:`` — a started fake, stopped afterwards."""
    fake = GceFake(**kwargs).start()
    try:
        yield fake
    finally:
        fake.stop()
