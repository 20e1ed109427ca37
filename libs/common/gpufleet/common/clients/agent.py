"""Client of the AgentService on one machine, used by the scheduler and the reaper."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import grpc
from google.protobuf.duration_pb2 import Duration

from gpufleet.common import errors, grpcclient
from gpufleet.common.trust.identity import Role
from gpufleet.common.trust.transport import Transport
from gpufleet.v1 import agent_service_pb2, agent_service_pb2_grpc

# Statuses that are no agent's answer about an attempt (it was not reached, or not as itself).
_NO_ANSWER = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.CANCELLED,
    }
)

# Each try's deadline of a call to an agent (StartJobs, CancelJob, the probe's calls).
TIMEOUT_S = 5.0


class AgentClient:
    """The agent of one machine. Short deadlines: an agent that does not answer quickly
    counts as unreachable.

    Only that machine can answer: the channel checks that the serving certificate names
    ``machine_id`` (``<id>.machine.gpufleet.<deployment>``), not merely some machine of the
    deployment. A cloud hands a destroyed machine's address to the next instance it starts;
    without the check, a probe of the old machine answered by the new one would keep the
    old one looking alive, and a job dispatched to it would run where no record says."""

    def __init__(
        self, machine_id: str, address: str, transport: Transport, timeout_s: float = TIMEOUT_S
    ) -> None:
        self.machine_id = machine_id
        self.address = address
        self.timeout_s = timeout_s
        self._raw = transport.channel(address, transport.server_name(Role.MACHINE, machine_id))
        self._channel = grpcclient.intercepted(self._raw)
        self._stub = agent_service_pb2_grpc.AgentServiceStub(self._channel)
        # Whether the agent serves StartJobs (false once it answered UNIMPLEMENTED).
        self._batches = True

    def close(self) -> None:
        self._channel.close()

    def connect(self) -> grpc.Future[None]:
        """Start connecting (the TLS handshake) in gRPC's own threads and return at once:
        the first call to a machine then finds its connection ready. Waits for nothing; the
        future says when the connection is ready, for whoever wants to know."""
        return grpc.channel_ready_future(self._raw)

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def probe(self) -> agent_service_pb2.ProbeResponse:
        resp: agent_service_pb2.ProbeResponse = grpcclient.call(
            self._stub.Probe,
            agent_service_pb2.ProbeRequest(),
            timeout=self.timeout_s,
            idempotent=True,
            attempts=1,
        )
        return resp

    def sample(self, window: timedelta = timedelta(seconds=2)) -> agent_service_pb2.SampleUtilizationResponse:
        dur = Duration()
        dur.FromTimedelta(window)
        resp: agent_service_pb2.SampleUtilizationResponse = grpcclient.call(
            self._stub.SampleUtilization,
            agent_service_pb2.SampleUtilizationRequest(window=dur),
            timeout=self.timeout_s + window.total_seconds(),
            idempotent=True,
            attempts=1,
        )
        return resp

    def start_job(
        self, request: agent_service_pb2.AgentServiceStartJobRequest
    ) -> agent_service_pb2.AgentServiceStartJobResponse:
        # Idempotent by attempt_id on the agent side, so a retry is safe.
        resp: agent_service_pb2.AgentServiceStartJobResponse = grpcclient.call(
            self._stub.StartJob, request, timeout=self.timeout_s, idempotent=True
        )
        return resp

    def start_jobs(
        self, requests: list[agent_service_pb2.AgentServiceStartJobRequest]
    ) -> list[agent_service_pb2.StartJobResult]:
        """Start several attempts on this machine in one call, each answered on its own (in
        the requests' order). An agent that predates StartJobs (UNIMPLEMENTED) is sent one
        StartJob each instead, their answers and refusals read the same way; a transport
        failure of the one call raises, as StartJob's would."""
        if not self._batches:
            return [self._start_one(r) for r in requests]
        try:
            resp: agent_service_pb2.StartJobsResponse = grpcclient.call(
                self._stub.StartJobs,
                agent_service_pb2.StartJobsRequest(jobs=requests),
                timeout=self.timeout_s,
                idempotent=True,
            )
        except errors.GpufleetError as exc:
            if getattr(exc, "grpc_code", None) != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self._batches = False
            return [self._start_one(r) for r in requests]
        return list(resp.results)

    def _start_one(
        self, request: agent_service_pb2.AgentServiceStartJobRequest
    ) -> agent_service_pb2.StartJobResult:
        try:
            answer = self.start_job(request)
        except errors.GpufleetError as exc:
            code = getattr(exc, "grpc_code", None)
            if code is None or code in _NO_ANSWER:
                raise  # not this attempt's answer: the agent did not answer
            return agent_service_pb2.StartJobResult(
                attempt_id=request.attempt_id, code=code.value[0], message=str(exc)
            )
        return agent_service_pb2.StartJobResult(
            attempt_id=request.attempt_id, already_running=answer.already_running
        )

    def read_job_log(
        self, attempt_id: str, offset: int, max_bytes: int
    ) -> agent_service_pb2.ReadJobLogResponse:
        resp: agent_service_pb2.ReadJobLogResponse = grpcclient.call(
            self._stub.ReadJobLog,
            agent_service_pb2.ReadJobLogRequest(attempt_id=attempt_id, offset=offset, max_bytes=max_bytes),
            timeout=self.timeout_s,
            idempotent=True,
        )
        return resp

    def cancel_job(self, attempt_id: str, reason: str) -> agent_service_pb2.AgentServiceCancelJobResponse:
        resp: agent_service_pb2.AgentServiceCancelJobResponse = grpcclient.call(
            self._stub.CancelJob,
            agent_service_pb2.AgentServiceCancelJobRequest(attempt_id=attempt_id, reason=reason),
            timeout=self.timeout_s,
            idempotent=True,
        )
        return resp


class AgentClients:
    """One client — one channel — per machine at its address, reused across calls.

    Opening a channel per call cost 2.2 times a reused one, and a fleet tick dispatching
    thousands of jobs would open thousands. gRPC channels reconnect by themselves, so a
    client is kept until :meth:`close`. Keyed by machine and address together: a machine
    that moved gets a new channel, and an address another machine took over is dialled as
    that machine's (its certificate decides who answers)."""

    def __init__(self, factory: Callable[[str, str], AgentClient]) -> None:
        self._factory = factory
        self._clients: dict[tuple[str, str], AgentClient] = {}
        self._lock = threading.Lock()

    def get(self, machine_id: str, address: str) -> AgentClient:
        with self._lock:
            client = self._clients.get((machine_id, address))
            if client is None:
                client = self._clients[(machine_id, address)] = self._factory(machine_id, address)
            return client

    def has(self, machine_id: str, address: str) -> bool:
        with self._lock:
            return (machine_id, address) in self._clients

    def connect(self, machine_id: str, address: str) -> grpc.Future[None] | None:
        """Have a connection to the machine's agent ready before its first dispatch (a
        TLS handshake per machine, once: a burst to thousands of machines on cold channels
        spent most of its time in them). None when a client exists already."""
        if self.has(machine_id, address):
            return None
        return self.get(machine_id, address).connect()

    def retain(self, keep: set[tuple[str, str]]) -> int:
        """Close the clients of every (machine, address) not in ``keep`` — machines destroyed
        or moved — so that a long-lived scheduler's channels follow its fleet, not every
        machine it ever had. A call that still wants one opens it again. Returns how many
        were closed."""
        with self._lock:
            gone = [key for key in self._clients if key not in keep]
            closing = [self._clients.pop(key) for key in gone]
        for client in closing:
            client.close()
        return len(closing)

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
