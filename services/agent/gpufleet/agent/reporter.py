"""How the worker reports for itself to the scheduler's ``WorkerService``.

Every call is idempotent on the scheduler's side: a heartbeat (the machine's
``worker_report_at`` and the leases of the attempts it names), a completion per attempt
(keyed by attempt id), and a checkpoint's parts, commit and read. The worker owns the
cadence and the retries; this module only turns a call into "acknowledged", "refused for good" or "try again".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.agent.gpu_health import load_report, to_proto
from gpufleet.agent.specs import AttemptResult
from gpufleet.common import errors, grpcclient
from gpufleet.common.trust.identity import Role
from gpufleet.common.trust.transport import Transport
from gpufleet.v1 import worker_service_pb2, worker_service_pb2_grpc


@dataclass(frozen=True)
class Running:
    """An attempt the worker runs, as a heartbeat names it."""

    attempt_id: str
    slot: int


@dataclass(frozen=True)
class HeartbeatAnswer:
    """What an acknowledged heartbeat says back."""

    # Attempts to stop: the control plane ended them (or never gave them to this machine).
    cancel_ids: list[str]
    # The lease the scheduler granted the other attempts named, in its clock seconds (0: it
    # did not say).
    lease_s: float = 0.0


class ReportRefused(Exception):
    """The scheduler answered and will never accept this report (unknown attempt, bad
    request, attempt already ended otherwise): retrying cannot help."""


# Codes that are the scheduler's final word on a completion; anything else is retried.
_FINAL = (errors.InvalidArgument, errors.NotFound, errors.FailedPrecondition)


class SchedulerReports(Protocol):
    def heartbeat(self, running: Sequence[Running], now: datetime) -> HeartbeatAnswer:
        """Report liveness and the attempts running; the attempt ids to cancel and the
        lease granted the rest. Raises GpufleetError when the scheduler cannot be reached."""
        ...

    def complete(self, result: AttemptResult) -> None:
        """Report one ended attempt. Raises ReportRefused when the scheduler refuses it for
        good, GpufleetError when it should be tried again."""
        ...

    def put_checkpoint_part(self, attempt_id: str, upload_id: str, offset: int, data: bytes) -> int:
        """Send one part of a checkpoint; the bytes the scheduler holds. Raises
        ReportRefused or GpufleetError as ``complete`` does."""
        ...

    def commit_checkpoint(self, attempt_id: str, upload_id: str, size: int, sha256: str) -> int:
        """The upload is whole; the checkpoint's sequence number."""
        ...

    def read_checkpoint(self, attempt_id: str, checkpoint_id: str, offset: int) -> tuple[bytes, bool]:
        """Part of the checkpoint an attempt starts from, and whether it is the last."""
        ...


class GrpcSchedulerReports:
    """The real peer: the scheduler's WorkerService over gRPC, one deadline per call.

    Calls are made once (no transport retries inside): the worker's own loop retries on
    the clock, so a down scheduler never stalls the loop for a back-off.
    """

    def __init__(
        self,
        address: str,
        machine_id: str,
        timeout_s: float,
        transport: Transport,
        *,
        gpu_health_file: Path | None = None,
    ) -> None:
        self.machine_id = machine_id
        self.timeout_s = timeout_s
        # The agent's GPU health watcher writes it; every heartbeat carries what it says.
        self.gpu_health_file = gpu_health_file
        self._channel = grpcclient.open_channel(address, transport, Role.SCHEDULER)
        self._stub = worker_service_pb2_grpc.WorkerServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def heartbeat(self, running: Sequence[Running], now: datetime) -> HeartbeatAnswer:
        report_time = Timestamp()
        report_time.FromDatetime(now)
        request = worker_service_pb2.ReportHeartbeatRequest(
            machine_id=self.machine_id,
            report_time=report_time,
            running=[
                worker_service_pb2.RunningAttempt(attempt_id=r.attempt_id, slot=r.slot) for r in running
            ],
        )
        if self.gpu_health_file is not None:
            health = load_report(self.gpu_health_file)
            if health is not None:
                request.gpu_health.CopyFrom(to_proto(health))
        response = grpcclient.call(
            self._stub.ReportHeartbeat, request, timeout=self.timeout_s, idempotent=True, attempts=1
        )
        return HeartbeatAnswer(list(response.cancel_attempt_ids), float(response.lease_s))

    def complete(self, result: AttemptResult) -> None:
        request = worker_service_pb2.ReportCompletionRequest(
            machine_id=self.machine_id,
            attempt_id=result.attempt_id,
            outcome=result.outcome.to_proto(),
            exit_code=result.exit_code,
            slot_seconds=result.slot_seconds,
            message=result.message,
            slot_not_closed=result.slot_not_closed,
            disrupted=result.disrupted,
        )
        self._once(self._stub.ReportCompletion, request)

    def put_checkpoint_part(self, attempt_id: str, upload_id: str, offset: int, data: bytes) -> int:
        request = worker_service_pb2.PutCheckpointPartRequest(
            machine_id=self.machine_id, attempt_id=attempt_id, upload_id=upload_id, offset=offset, data=data
        )
        return int(self._once(self._stub.PutCheckpointPart, request).received_bytes)

    def commit_checkpoint(self, attempt_id: str, upload_id: str, size: int, sha256: str) -> int:
        request = worker_service_pb2.CommitCheckpointRequest(
            machine_id=self.machine_id,
            attempt_id=attempt_id,
            upload_id=upload_id,
            size_bytes=size,
            sha256=sha256,
        )
        return int(self._once(self._stub.CommitCheckpoint, request).sequence)

    def read_checkpoint(self, attempt_id: str, checkpoint_id: str, offset: int) -> tuple[bytes, bool]:
        request = worker_service_pb2.ReadCheckpointRequest(
            machine_id=self.machine_id, attempt_id=attempt_id, checkpoint_id=checkpoint_id, offset=offset
        )
        response = self._once(self._stub.ReadCheckpoint, request)
        return bytes(response.data), bool(response.eof)

    def _once(self, method: Any, request: Any) -> Any:
        """One idempotent call; the scheduler's final word raised as ReportRefused."""
        try:
            return grpcclient.call(method, request, timeout=self.timeout_s, idempotent=True, attempts=1)
        except _FINAL as err:
            raise ReportRefused(str(err)) from err
