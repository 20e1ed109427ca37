"""The test's own stand-in for the scheduler: a real WorkerService gRPC server on
127.0.0.1 that records what the worker reports. It is the peer under observation, not a
mock of the code under test: the agent, worker and runners are real processes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpufleet.common.errors import Unavailable
from gpufleet.common.grpcserver import ServiceBinding, ServiceServer, create_server
from gpufleet.v1 import machine_pb2, worker_service_pb2, worker_service_pb2_grpc
from tests.support import tls

T = TypeVar("T")


@dataclass
class Heartbeat:
    received_at: float  # real monotonic seconds
    machine_id: str
    running: dict[str, int]  # attempt id -> slot
    gpu_health: machine_pb2.GpuHealth | None = None  # None: not reported


@dataclass
class FakeWorkerService(worker_service_pb2_grpc.WorkerServiceServicer):
    heartbeats: list[Heartbeat] = field(default_factory=list)
    # Every ReportCompletion call, acknowledged or not (to see retries).
    completion_calls: list[worker_service_pb2.ReportCompletionRequest] = field(default_factory=list)
    # The acknowledged completion per attempt (the first one).
    completions: dict[str, worker_service_pb2.ReportCompletionRequest] = field(default_factory=dict)
    # Attempt ids the next heartbeat answers with, once.
    cancel_next: set[str] = field(default_factory=set)
    # How many further ReportCompletion calls to answer UNAVAILABLE.
    refuse_completions: int = 0
    # The lease a heartbeat grants, in clock seconds (the e2e stacks' 900 by default), and
    # the clock's speed, to keep the scheduler's books: when (real monotonic seconds) each
    # attempt's lease runs out, as the real scheduler would find it expired.
    lease_s: float = 900.0
    clock_speed: float = 1.0
    lease_ends: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def grant(self, attempt_id: str, at: float) -> None:
        """A lease from ``at`` (monotonic), as dispatch and every heartbeat grant one."""
        with self.lock:
            self.lease_ends[attempt_id] = at + self.lease_s / self.clock_speed

    def lease_end(self, attempt_id: str) -> float:
        with self.lock:
            return self.lease_ends[attempt_id]

    def ReportHeartbeat(self, request: Any, context: Any) -> Any:
        received = time.monotonic()
        with self.lock:
            self.heartbeats.append(
                Heartbeat(
                    received,
                    request.machine_id,
                    {r.attempt_id: r.slot for r in request.running},
                    request.gpu_health if request.HasField("gpu_health") else None,
                )
            )
            cancel, self.cancel_next = sorted(self.cancel_next), set()
            for r in request.running:
                if r.attempt_id not in cancel:
                    self.lease_ends[r.attempt_id] = received + self.lease_s / self.clock_speed
        return worker_service_pb2.ReportHeartbeatResponse(cancel_attempt_ids=cancel, lease_s=self.lease_s)

    def ReportCompletion(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.completion_calls.append(request)
            if self.refuse_completions > 0:
                self.refuse_completions -= 1
                raise Unavailable("scheduler is restarting")
            self.completions.setdefault(request.attempt_id, request)
        return worker_service_pb2.ReportCompletionResponse()

    def heartbeats_since(self, since: float) -> list[Heartbeat]:
        with self.lock:
            return [h for h in self.heartbeats if h.received_at >= since]

    def completion(self, attempt_id: str) -> worker_service_pb2.ReportCompletionRequest | None:
        with self.lock:
            return self.completions.get(attempt_id)


def start_fake_scheduler() -> tuple[FakeWorkerService, ServiceServer]:
    fake = FakeWorkerService()
    full_name = worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"].full_name
    server = create_server(
        "127.0.0.1:0",
        [ServiceBinding(worker_service_pb2_grpc.add_WorkerServiceServicer_to_server, fake, full_name)],
        transport=tls.transport("scheduler"),
    )
    return fake, server


def wait_for(check: Callable[[], T | None], timeout: float = 15.0, what: str = "condition") -> T:
    """Poll ``check`` (real time) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
