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
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ReportHeartbeat(self, request: Any, context: Any) -> Any:
        with self.lock:
            self.heartbeats.append(
                Heartbeat(
                    time.monotonic(),
                    request.machine_id,
                    {r.attempt_id: r.slot for r in request.running},
                    request.gpu_health if request.HasField("gpu_health") else None,
                )
            )
            cancel, self.cancel_next = sorted(self.cancel_next), set()
        return worker_service_pb2.ReportHeartbeatResponse(cancel_attempt_ids=cancel)

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
