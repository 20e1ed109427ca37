"""moto's EC2 server on loopback for the aws driver's tests, and the faults it cannot make.

:func:`start_moto_server` runs ``moto.server.ThreadedMotoServer`` on 127.0.0.1, port 0,
inside the test process; the driver (or a provisioner process) reaches it through
``endpoint_url`` with dummy credentials, exactly as it would reach EC2.

moto never runs out of capacity, never hits a quota, accepts any credentials and ignores
``ClientToken``. :class:`Ec2Faults` supplies those answers through botocore's own event
system on each client the driver builds (``Ec2Clients(on_client=faults.attach)``):

- ``before-call`` may answer instead of moto: an HTTP error carrying an EC2 error code,
  which botocore turns into a real ``ClientError``, or a transport exception;
- ``after-call`` may throw away moto's answer after moto acted (a lost response);
- ``before-parameter-build`` records every call's parameters, for assertions.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

from gpufleet.common.provider_errors import ProviderError
from gpufleet.common.trust.pki import MachineIssuer
from gpufleet.provisioner.drivers.aws import AwsDriver, AwsOptions
from gpufleet.provisioner.drivers.aws_clients import ClientBounds, Ec2Clients

DUMMY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


def credentials_env() -> dict[str, str]:
    """Environment for a child process whose boto3 chain must find dummy credentials in
    the environment and nowhere else (no shared files, no instance metadata)."""
    return {
        **DUMMY_CREDENTIALS,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


@dataclass
class MotoServer:
    """One moto server; its state is shared by every client until :meth:`reset`."""

    url: str
    _server: Any
    _images: dict[str, str] = field(default_factory=dict)
    _session: boto3.Session | None = None

    def session(self) -> boto3.Session:
        """One session for the whole run: it caches the (large) EC2 service model, so a
        new client costs milliseconds, not a second. Tests build clients from one thread."""
        if self._session is None:
            self._session = boto3.Session(
                aws_access_key_id=DUMMY_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=DUMMY_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            )
        return self._session

    def client(self, region: str) -> Any:
        """A plain EC2 client of the test itself (to plant or inspect instances)."""
        return self.session().client("ec2", region_name=region, endpoint_url=self.url)

    def image(self, region: str) -> str:
        """One of moto's default AMIs in ``region`` (moto accepts any of them)."""
        if region not in self._images:
            images = self.client(region).describe_images(Owners=["amazon"])["Images"]
            self._images[region] = sorted(i["ImageId"] for i in images)[0]
        return self._images[region]

    def clear(self, regions: tuple[str, ...]) -> None:
        """Terminate every instance still alive in ``regions``, so a test starts with none
        (a terminated instance does not exist for the driver). Cheaper than moto's reset,
        which rebuilds each region's catalogue of default images on next use."""
        for region in regions:
            alive = [i["InstanceId"] for i in self.instances(region, alive=True)]
            if alive:
                self.client(region).terminate_instances(InstanceIds=alive)

    def instances(
        self, region: str, tags: Mapping[str, str] | None = None, *, alive: bool = False
    ) -> list[dict[str, Any]]:
        """The instances moto holds in ``region`` (any state, or only live ones), by tag."""
        args = [{"Name": f"tag:{k}", "Values": [v]} for k, v in (tags or {}).items()]
        if alive:
            args.append(
                {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}
            )
        pages = self.client(region).get_paginator("describe_instances").paginate(Filters=args)
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def stop(self) -> None:
        self._server.stop()


def start_moto_server() -> MotoServer:
    # moto reads this once, when it is imported: with it, an unknown instance type is refused.
    os.environ.setdefault("MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION", "true")
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    return MotoServer(url=f"http://{host}:{port}", _server=server)


@dataclass(frozen=True)
class ErrorAnswer:
    """An EC2 error response: botocore raises it as a ClientError with this code."""

    code: str
    status: int = 400


Fault = ErrorAnswer | Exception


def read_timeout() -> Exception:
    error: Exception = ReadTimeoutError(endpoint_url="http://ec2.test")
    return error


def connection_closed() -> Exception:
    error: Exception = ConnectionClosedError(endpoint_url="http://ec2.test")
    return error


@dataclass(frozen=True)
class Call:
    operation: str
    params: Mapping[str, Any]
    region: str


class Ec2Faults:
    """Scripted EC2 faults and a record of every call, on every client given to :meth:`attach`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (operation or None for any, region or None for any, fault)
        self._next: deque[tuple[str | None, str | None, Fault]] = deque()
        self._lost: deque[tuple[str, Exception]] = deque()
        self._stockouts: set[str] = set()
        self._extra_fields: dict[str, dict[str, Any]] = {}
        self._lagging = False
        self._not_described_yet: set[str] = set()
        self._slow_terminations = False
        self._shutting_down: set[str] = set()
        self._held_terminations: dict[str, threading.Event] = {}
        self.calls: list[Call] = []

    # ---- the script -------------------------------------------------------------------

    def fail_next(
        self, fault: Fault, operation: str | None = None, *, region: str | None = None, times: int = 1
    ) -> None:
        """The next ``times`` calls of ``operation`` (any when None) in ``region`` (any when
        None) get ``fault`` instead of reaching moto."""
        with self._lock:
            self._next.extend([(operation, region, fault)] * times)

    def lose_next_answer(self, operation: str, error: Exception | None = None) -> None:
        """The next call of ``operation`` reaches moto and acts, then its answer is lost: the
        caller sees ``error`` (default: the connection closed before the answer)."""
        with self._lock:
            self._lost.append((operation, error or connection_closed()))

    def stockout(self, zone: str, out: bool = True) -> None:
        """While out, RunInstances in ``zone`` answers InsufficientInstanceCapacity (HTTP 500,
        as EC2 sends it)."""
        with self._lock:
            (self._stockouts.add if out else self._stockouts.discard)(zone)

    def describe_with(self, instance_id: str, **fields: Any) -> None:
        """DescribeInstances answers show ``fields`` on ``instance_id`` (what moto leaves out,
        e.g. the SpotInstanceRequestId EC2 gives a spot instance)."""
        with self._lock:
            self._extra_fields[instance_id] = dict(fields)

    def lag_describe(self, lag: bool = True) -> None:
        """While on, an instance that RunInstances launches is not in DescribeInstances
        answers until :meth:`catch_up` — EC2's documented eventual consistency: a describe
        right after a launch may not show the instance yet."""
        with self._lock:
            self._lagging = lag

    def catch_up(self) -> None:
        """DescribeInstances shows every instance launched so far."""
        with self._lock:
            self._not_described_yet.clear()

    def terminate_slowly(self, slow: bool = True) -> None:
        """While on, TerminateInstances is accepted as EC2 accepts it — answered
        ``shutting-down`` — and the instance stays shutting-down in DescribeInstances until
        :meth:`finish_terminations` (moto ends an instance at once; EC2 takes a while, and
        now and then hours)."""
        with self._lock:
            self._slow_terminations = slow

    def finish_terminations(self) -> list[str]:
        """The instances left shutting-down; the caller terminates them in moto (its own
        client), after which DescribeInstances shows them terminated."""
        with self._lock:
            ids = sorted(self._shutting_down)
            self._shutting_down.clear()
            self._slow_terminations = False
        return ids

    def shutting_down(self) -> set[str]:
        """The instances a slow terminate left shutting-down (moto still runs them)."""
        with self._lock:
            return set(self._shutting_down)

    def hold_terminations_of(self, instance_id: str) -> None:
        """A TerminateInstances of ``instance_id`` waits, unanswered, until
        :meth:`release_terminations` — a call that hangs; other calls are served meanwhile."""
        with self._lock:
            self._held_terminations.setdefault(instance_id, threading.Event())

    def release_terminations(self) -> None:
        with self._lock:
            held = list(self._held_terminations.values())
            self._held_terminations.clear()
        for released in held:
            released.set()

    def calls_of(self, operation: str) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.operation == operation]

    def operations(self) -> list[str]:
        with self._lock:
            return [c.operation for c in self.calls]

    # ---- the hooks ----------------------------------------------------------------------

    def attach(self, region: str, client: Any) -> None:
        events = client.meta.events
        events.register("before-parameter-build.ec2", self._recorder(region))
        events.register("before-call.ec2", self._before_call(region))
        events.register("after-call.ec2", self._after_call)

    def _recorder(self, region: str) -> Any:
        def record(params: Mapping[str, Any], model: Any, **_: Any) -> None:
            with self._lock:
                self.calls.append(Call(model.name, dict(params), region))

        return record

    def _before_call(self, region: str) -> Any:
        def answer(model: Any, params: Mapping[str, Any], **_: Any) -> Any:
            if model.name == "TerminateInstances":
                ids = _instance_ids(params)
                with self._lock:
                    held = [self._held_terminations[i] for i in ids if i in self._held_terminations]
                for released in held:
                    released.wait(300)
                with self._lock:
                    if self._slow_terminations:
                        self._shutting_down.update(ids)
                        return _shutting_down_answer(ids)
            fault = self._take_fault(model.name, region, params)
            if fault is None:
                return None
            if isinstance(fault, Exception):
                raise fault
            return _error_response(fault)

        return answer

    def _take_fault(self, operation: str, region: str, params: Mapping[str, Any]) -> Fault | None:
        with self._lock:
            for index, (wanted, where, fault) in enumerate(self._next):
                if wanted in (None, operation) and where in (None, region):
                    del self._next[index]
                    return fault
            if operation == "RunInstances":
                body = params.get("body") or {}
                if isinstance(body, Mapping) and body.get("Placement.AvailabilityZone") in self._stockouts:
                    return ErrorAnswer("InsufficientInstanceCapacity", 500)
        return None

    def _after_call(self, model: Any, http_response: Any, parsed: Any, **_: Any) -> None:
        if http_response.status_code >= 300:
            return
        with self._lock:
            if model.name == "RunInstances" and self._lagging:
                self._not_described_yet.update(i["InstanceId"] for i in parsed.get("Instances", []))
            if model.name == "DescribeInstances" and self._not_described_yet:
                for reservation in parsed.get("Reservations", []):
                    reservation["Instances"] = [
                        i
                        for i in reservation.get("Instances", [])
                        if i.get("InstanceId") not in self._not_described_yet
                    ]
                parsed["Reservations"] = [r for r in parsed.get("Reservations", []) if r["Instances"]]
            if model.name == "DescribeInstances" and self._shutting_down:
                for reservation in parsed.get("Reservations", []):
                    for instance in reservation.get("Instances", []):
                        if instance.get("InstanceId") in self._shutting_down:
                            instance["State"] = {"Code": 32, "Name": "shutting-down"}
            if model.name == "DescribeInstances" and self._extra_fields:
                for reservation in parsed.get("Reservations", []):
                    for instance in reservation.get("Instances", []):
                        instance.update(self._extra_fields.get(instance.get("InstanceId"), {}))
            lost = next((entry for entry in self._lost if entry[0] == model.name), None)
            if lost is None:
                return
            self._lost.remove(lost)
        raise lost[1]


def _instance_ids(params: Mapping[str, Any]) -> list[str]:
    body = params.get("body") or {}
    if not isinstance(body, Mapping):
        return []
    return [str(v) for k, v in body.items() if str(k).startswith("InstanceId.")]


def _shutting_down_answer(ids: list[str]) -> tuple[AWSResponse, dict[str, Any]]:
    """EC2's answer to a TerminateInstances it accepted: each instance shutting-down."""
    http = AWSResponse("http://ec2.test", 200, {}, None)
    parsed = {
        "TerminatingInstances": [
            {
                "InstanceId": i,
                "CurrentState": {"Code": 32, "Name": "shutting-down"},
                "PreviousState": {"Code": 16, "Name": "running"},
            }
            for i in ids
        ],
        "ResponseMetadata": {"HTTPStatusCode": 200, "RequestId": "injected"},
    }
    return http, parsed


def _error_response(answer: ErrorAnswer) -> tuple[AWSResponse, dict[str, Any]]:
    http = AWSResponse("http://ec2.test", answer.status, {}, None)
    parsed = {
        "Error": {"Code": answer.code, "Message": f"injected {answer.code}"},
        "ResponseMetadata": {"HTTPStatusCode": answer.status, "RequestId": "injected"},
    }
    return http, parsed


# One representative EC2 answer per typed error: what a contract test's injected error
# becomes at the SDK level, so the driver's own classification has to type it back.
_ANSWERS: dict[str, ErrorAnswer] = {
    "NOT_FOUND": ErrorAnswer("InvalidInstanceID.NotFound", 400),
    "INSUFFICIENT_CAPACITY": ErrorAnswer("InsufficientInstanceCapacity", 500),
    "QUOTA_EXCEEDED": ErrorAnswer("VcpuLimitExceeded", 400),
    "AUTH_FAILED": ErrorAnswer("UnauthorizedOperation", 403),
    "TRANSIENT": ErrorAnswer("RequestLimitExceeded", 503),
}


def fault_for(error: ProviderError) -> Fault:
    """The EC2-level fault that the aws driver must classify as ``error``'s type; a read
    timeout stands for NOT_YET_DONE (no EC2 error code means "outcome unknown")."""
    if error.kind == "NOT_YET_DONE":
        return read_timeout()
    return _ANSWERS[error.kind]


TEST_REGIONS = ("us-east-1", "eu-central-1")  # both offer g6 (eu-west-1 does not)


def aws_driver_for(
    moto: MotoServer,
    faults: Ec2Faults,
    deployment_id: str,
    *,
    regions: tuple[str, ...] = TEST_REGIONS,
    page_size: int = 5,
    machine_issuer: MachineIssuer | None = None,
    **options: Any,
) -> AwsDriver:
    """An aws driver on ``moto`` whose every client carries ``faults``' hooks; one attempt
    per call (no botocore retries), so each scripted fault is seen exactly once."""
    clients = Ec2Clients(
        moto.session(),
        endpoint_url=moto.url,
        bounds=ClientBounds(connect_timeout_s=5, read_timeout_s=20, max_attempts=1),
        on_client=faults.attach,
    )
    aws_options = AwsOptions(
        regions=regions, images={r: moto.image(r) for r in regions}, page_size=page_size, **options
    )
    return AwsDriver(deployment_id, aws_options, clients, machine_issuer=machine_issuer)
