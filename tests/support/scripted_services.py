"""In-test stand-ins for an agent and the provisioner, served over real gRPC on 127.0.0.1.

They play the other side of the reaper's and sweeper's calls: a test scripts what the
agent's sample says and which provisioner call fails next (with the same typed trailer,
``gpufleet-provider-error``, that the real provisioner sends), and then asserts on every
call they received — including that none arrived.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc

from gpufleet.common.grpcserver import ServiceBinding, ServiceServer, create_server
from gpufleet.common.provider_errors import BY_KIND, METADATA_KEY
from gpufleet.common.trust.transport import Transport
from gpufleet.v1 import (
    agent_service_pb2,
    agent_service_pb2_grpc,
    machine_pb2,
    provisioner_service_pb2,
    provisioner_service_pb2_grpc,
)
from tests.support import tls


class ScriptedAgent(agent_service_pb2_grpc.AgentServiceServicer):  # type: ignore[misc]
    """An agent whose next samples say what the test wants; ``reachable=False`` refuses."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sample = agent_service_pb2.SampleUtilizationResponse(sampler="scripted")
        self.reachable = True
        self.sample_calls = 0
        self.start_calls = 0
        self.server: ServiceServer | None = None
        # StartJob: accepted and recorded, or (``hang()``) held until ``release()``, as a
        # frozen agent holds it; CancelJob is recorded.
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self._hang = threading.Event()
        self._released = threading.Event()
        # SampleUtilization held (``freeze()``) until ``thaw()``, as a frozen agent holds it.
        self._thawed = threading.Event()
        self._thawed.set()

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    def quiet(self) -> None:
        self.set_sample(gpu=0.0, running=0, requests=0)

    def busy(self, *, gpu: float = 0.0, running: int = 0, requests: int = 0) -> None:
        self.set_sample(gpu=gpu, running=running, requests=requests)

    def set_sample(self, *, gpu: float, running: int, requests: int) -> None:
        with self.lock:
            self.sample = agent_service_pb2.SampleUtilizationResponse(
                gpu_utilization_percent=gpu,
                running_attempts=running,
                requests_since_last_sample=requests,
                sampler="scripted",
            )

    def SampleUtilization(
        self, request: agent_service_pb2.SampleUtilizationRequest, context: grpc.ServicerContext
    ) -> agent_service_pb2.SampleUtilizationResponse:
        self._thawed.wait(60)
        with self.lock:
            self.sample_calls += 1
            if not self.reachable:
                context.abort(grpc.StatusCode.UNAVAILABLE, "scripted: agent down")
            return self.sample

    def freeze(self) -> None:
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    def hang(self) -> None:
        self._hang.set()

    def release(self) -> None:
        self._hang.clear()
        self._released.set()

    def StartJob(
        self, request: agent_service_pb2.AgentServiceStartJobRequest, context: grpc.ServicerContext
    ) -> agent_service_pb2.AgentServiceStartJobResponse:
        with self.lock:
            self.start_calls += 1  # received, whether or not it then hangs
        if self._hang.is_set():
            self._released.wait(120)
        with self.lock:
            again = request.attempt_id in self.started
            if not again:
                self.started.append(request.attempt_id)
        return agent_service_pb2.AgentServiceStartJobResponse(already_running=again)

    def StartJobs(
        self, request: agent_service_pb2.StartJobsRequest, context: grpc.ServicerContext
    ) -> agent_service_pb2.StartJobsResponse:
        """Each attempt as StartJob answers it (a hang holds the whole call)."""
        return agent_service_pb2.StartJobsResponse(
            results=[
                agent_service_pb2.StartJobResult(
                    attempt_id=job.attempt_id, already_running=self.StartJob(job, context).already_running
                )
                for job in request.jobs
            ]
        )

    def CancelJob(
        self, request: agent_service_pb2.AgentServiceCancelJobRequest, context: grpc.ServicerContext
    ) -> agent_service_pb2.AgentServiceCancelJobResponse:
        with self.lock:
            self.cancelled.append(request.attempt_id)
        return agent_service_pb2.AgentServiceCancelJobResponse(was_running=True)

    def Probe(
        self, request: agent_service_pb2.ProbeRequest, context: grpc.ServicerContext
    ) -> agent_service_pb2.ProbeResponse:
        if not self.reachable:
            context.abort(grpc.StatusCode.UNAVAILABLE, "scripted: agent down")
        return agent_service_pb2.ProbeResponse(worker_alive=True, startup_complete=True)


@dataclass(frozen=True)
class ProviderCall:
    op: str
    machine_id: str
    provider_instance_id: str
    request_id: str


@dataclass
class ScriptedProvisioner(provisioner_service_pb2_grpc.ProvisionerServiceServicer):  # type: ignore[misc]
    """Records stop/destroy/list calls; ``fail_next(op, kind)`` makes the next one fail typed."""

    calls: list[ProviderCall] = field(default_factory=list)
    instances: list[provisioner_service_pb2.Instance] = field(default_factory=list)
    unreachable: list[machine_pb2.Provider] = field(default_factory=list)
    failures: dict[str, list[str]] = field(default_factory=dict)
    server: ServiceServer | None = None

    def __post_init__(self) -> None:
        self.lock = threading.Lock()

    @property
    def address(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.port}"

    def fail_next(self, op: str, kind: str = "TRANSIENT", times: int = 1) -> None:
        with self.lock:
            self.failures.setdefault(op, []).extend([kind] * times)

    def ops(self, op: str | None = None) -> list[ProviderCall]:
        with self.lock:
            return [c for c in self.calls if op is None or c.op == op]

    def list_instance(
        self,
        machine_id: str,
        provider_instance_id: str,
        *,
        provider: machine_pb2.Provider = machine_pb2.PROVIDER_SIM,
        status: provisioner_service_pb2.InstanceStatus = provisioner_service_pb2.INSTANCE_STATUS_RUNNING,
        label: bool = True,
    ) -> None:
        labels = {"gpufleet-machine": machine_id, "gpufleet-deployment": "test"} if label else {}
        with self.lock:
            self.instances.append(
                provisioner_service_pb2.Instance(
                    name=f"instances/{provider}/{provider_instance_id}",
                    machine_id=machine_id if label else "",
                    provider=provider,
                    provider_instance_id=provider_instance_id,
                    status=status,
                    labels=labels,
                )
            )

    def _enter(
        self, op: str, machine_id: str, instance: str, request_id: str, context: grpc.ServicerContext
    ) -> None:
        with self.lock:
            self.calls.append(ProviderCall(op, machine_id, instance, request_id))
            queue = self.failures.get(op)
            kind = queue.pop(0) if queue else None
        if kind is not None:
            context.set_trailing_metadata(((METADATA_KEY, kind),))
            context.abort(BY_KIND[kind].code, f"scripted {kind.lower()} on {op}")

    def StopInstance(
        self, request: provisioner_service_pb2.StopInstanceRequest, context: grpc.ServicerContext
    ) -> provisioner_service_pb2.Instance:
        self._enter("stop", request.machine_id, request.provider_instance_id, request.request_id, context)
        return provisioner_service_pb2.Instance(
            machine_id=request.machine_id,
            provider_instance_id=request.provider_instance_id,
            status=provisioner_service_pb2.INSTANCE_STATUS_STOPPED,
        )

    def DestroyInstance(
        self, request: provisioner_service_pb2.DestroyInstanceRequest, context: grpc.ServicerContext
    ) -> provisioner_service_pb2.DestroyInstanceResponse:
        self._enter("destroy", request.machine_id, request.provider_instance_id, request.request_id, context)
        return provisioner_service_pb2.DestroyInstanceResponse(existed=True)

    def ListInstances(
        self, request: provisioner_service_pb2.ListInstancesRequest, context: grpc.ServicerContext
    ) -> provisioner_service_pb2.ListInstancesResponse:
        self._enter("list", "", "", "", context)
        with self.lock:
            return provisioner_service_pb2.ListInstancesResponse(
                instances=list(self.instances), unreachable=list(self.unreachable)
            )


def agent_server(agent: ScriptedAgent, transport: Transport, max_workers: int = 8) -> ServiceServer:
    """``agent`` served on loopback with ``transport``'s identity (set as its ``server``)."""
    agent.server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                agent_service_pb2_grpc.add_AgentServiceServicer_to_server,
                agent,
                agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
            )
        ],
        max_workers=max_workers,
        transport=transport,
    )
    return agent.server


@contextmanager
def serve_agent(transport: Transport | None = None) -> Iterator[ScriptedAgent]:
    """A scripted agent on loopback; by default it answers for any machine id (``transport``:
    serve as one machine instead)."""
    agent = ScriptedAgent()
    # By default it answers for every machine a test registers at its address.
    agent_server(agent, transport or tls.stand_in_agent_transport())
    assert agent.server is not None
    try:
        yield agent
    finally:
        agent.release()
        agent.thaw()
        agent.server.stop(0)


@contextmanager
def serve_provisioner() -> Iterator[ScriptedProvisioner]:
    prov = ScriptedProvisioner()
    prov.server = create_server(
        "127.0.0.1:0",
        [
            ServiceBinding(
                provisioner_service_pb2_grpc.add_ProvisionerServiceServicer_to_server,
                prov,
                provisioner_service_pb2.DESCRIPTOR.services_by_name["ProvisionerService"].full_name,
            )
        ],
        max_workers=4,
        transport=tls.transport("provisioner"),
    )
    try:
        yield prov
    finally:
        prov.server.stop(0)
