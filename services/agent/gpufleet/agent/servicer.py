"""``AgentService``: what the control plane asks of one machine.

The daemon answers from the state directory and hands work to the worker through it:
StartJob drops an atomically written spec into the inbox, CancelJob a cancel request.
Both are durable the moment the call returns, whether or not the worker is looking, and
both are idempotent by attempt id.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.agent import views
from gpufleet.agent.dead_man import Contact
from gpufleet.agent.gpu_health import GpuHealthWatcher, to_proto
from gpufleet.agent.pauses import PauseWatch, may_have_outlived
from gpufleet.agent.samplers import RequestCounter, UtilizationSampler
from gpufleet.agent.settings import AGENT_VERSION
from gpufleet.agent.specs import JobSpec
from gpufleet.agent.statedir import ATTEMPT_ID_PATTERN, AttemptFiles, StateDir, atomic_write_text
from gpufleet.agent.supervisor import WorkerWatch, startup_status
from gpufleet.common import paging
from gpufleet.common.clock import Clock
from gpufleet.common.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    GpufleetError,
    InvalidArgument,
    NotFound,
)
from gpufleet.common.violations import Violations
from gpufleet.v1 import agent_service_pb2, agent_service_pb2_grpc

DEFAULT_WINDOW = timedelta(seconds=2)
MAX_WINDOW = timedelta(seconds=30)


class StateActivity:
    """The machine's activity as samplers see it: attempts from the state directory,
    requests from the servicer's counter."""

    def __init__(self, state: StateDir, requests: RequestCounter) -> None:
        self.state = state
        self.requests = requests

    def running_attempts(self) -> int:
        return len(views.active_specs(self.state))

    def take_requests(self) -> int:
        return self.requests.take()


SHA256_PATTERN = re.compile(r"^[0-9a-f]{64}$")
# The most of a job's log one ReadJobLog answers with.
MAX_LOG_READ = 1 << 20
# Attempts in one StartJobs call: more slots than any machine has.
MAX_START_JOBS = 64
TOKEN_SCOPES = frozenset({"model", "voice"})
# What the agent accepts as a token (it checks no checksum: the control plane minted it).
TOKEN_PATTERN = re.compile(r"^[A-Za-z0-9_]{8,256}$")


def spec_from_request(request: agent_service_pb2.AgentServiceStartJobRequest, machine_slots: int) -> JobSpec:
    """Validate a StartJob request: one refusal naming every field to fix."""
    found = Violations()
    if not request.attempt_id:
        found.add("attempt_id", "is required", "REQUIRED")
    elif not ATTEMPT_ID_PATTERN.match(request.attempt_id):
        found.add(
            "attempt_id",
            "must be 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
            "INVALID_FORMAT",
        )
    if not request.job_id:
        found.add("job_id", "is required", "REQUIRED")
    held = request.slots or 1
    if not 0 <= request.slot < machine_slots:
        found.add("slot", f"must be within 0..{machine_slots - 1}", "OUT_OF_RANGE")
    elif held < 1 or request.slot + held > machine_slots:
        found.add(
            "slots",
            f"slot {request.slot} + {held} slots exceeds the machine's {machine_slots}",
            "OUT_OF_RANGE",
        )
    limit = request.time_limit.ToTimedelta() if request.HasField("time_limit") else timedelta(0)
    if limit < timedelta(0):
        found.add("time_limit", "must not be negative", "OUT_OF_RANGE")
    if any(not key for key in request.tenant_values):
        found.add("tenant_values", "keys must not be empty", "REQUIRED")
    if request.memory_limit_bytes < 0:
        found.add("memory_limit_bytes", "must not be negative", "OUT_OF_RANGE")
    if request.pids_limit < 0:
        found.add("pids_limit", "must not be negative", "OUT_OF_RANGE")
    if request.checkpoint_id:
        if not ATTEMPT_ID_PATTERN.match(request.checkpoint_id):
            found.add("checkpoint_id", "must be a checkpoint id", "INVALID_FORMAT")
        if not SHA256_PATTERN.match(request.checkpoint_sha256):
            found.add("checkpoint_sha256", "must be lowercase hex SHA-256", "INVALID_FORMAT")
        if request.checkpoint_size_bytes <= 0:
            found.add("checkpoint_size_bytes", "must be positive", "OUT_OF_RANGE")
    for scope, token in sorted(request.tokens.items()):
        if scope not in TOKEN_SCOPES:
            found.add(
                "tokens",
                f"unknown scope {scope!r}: one of {', '.join(sorted(TOKEN_SCOPES))}",
                "UNKNOWN_VALUE",
            )
        elif not TOKEN_PATTERN.match(token):
            found.add("tokens", f"the {scope} token is not a token", "INVALID_FORMAT")
    found.raise_if_any()
    return JobSpec(
        attempt_id=request.attempt_id,
        job_id=request.job_id,
        slot=request.slot,
        slots=held,
        kind=request.kind,
        pipeline_version=request.pipeline_version,
        workspace=request.workspace,
        request_id=request.request_id,
        tenant_values=dict(request.tenant_values),
        time_limit_s=limit.total_seconds(),
        outbound_network=request.outbound_network,
        memory_limit_bytes=request.memory_limit_bytes,
        pids_limit=request.pids_limit,
        keeps_checkpoint=request.keeps_checkpoint,
        checkpoint_id=request.checkpoint_id,
        checkpoint_sha256=request.checkpoint_sha256,
        tokens=dict(request.tokens),
        checkpoint_size_bytes=request.checkpoint_size_bytes,
    )


T = TypeVar("T")


def _from_control_plane(method: Callable[..., T]) -> Callable[..., T]:
    """Every AgentService call comes from the scheduler or the reaper (the authorization
    table): each one tells the dead-man switch the control plane is still there."""

    @functools.wraps(method)
    def heard(self: AgentServicer, request: Any, context: Any) -> T:
        if self.contact is not None:
            self.contact.heard(self.clock.now())
        return method(self, request, context)

    return heard


class AgentServicer(agent_service_pb2_grpc.AgentServiceServicer):  # type: ignore[misc]
    def __init__(
        self,
        *,
        machine_id: str,
        slots: int,
        state: StateDir,
        supervisor: WorkerWatch,
        sampler: UtilizationSampler,
        requests: RequestCounter,
        clock: Clock,
        pipeline_command: list[str],
        contact: Contact | None = None,
        gpu_health: GpuHealthWatcher | None = None,
        pauses: PauseWatch | None = None,
    ) -> None:
        self.contact = contact
        self.pauses = pauses
        self.monotonic = pauses.monotonic if pauses is not None else time.monotonic
        self.gpu_health = gpu_health
        self.machine_id = machine_id
        self.slots = slots
        self.state = state
        self.supervisor = supervisor
        self.sampler = sampler
        self.requests = requests
        self.clock = clock
        self.pipeline_command = pipeline_command
        # Serialises the check-then-write of StartJob/CancelJob within this daemon.
        self._lock = threading.Lock()

    @_from_control_plane
    def Probe(self, request: agent_service_pb2.ProbeRequest, context: Any) -> agent_service_pb2.ProbeResponse:
        complete, error = startup_status(self.state, self.supervisor, self.pipeline_command)
        return agent_service_pb2.ProbeResponse(
            machine_id=self.machine_id,
            agent_version=AGENT_VERSION,
            worker_alive=self.supervisor.alive(),
            startup_complete=complete,
            startup_error=error,
            slots=self.slots,
            sampler=self.sampler.name,
            gpu_health=to_proto(self.gpu_health.report() if self.gpu_health else None),
        )

    @_from_control_plane
    def SampleUtilization(
        self, request: agent_service_pb2.SampleUtilizationRequest, context: Any
    ) -> agent_service_pb2.SampleUtilizationResponse:
        window = request.window.ToTimedelta() if request.HasField("window") else DEFAULT_WINDOW
        if window < timedelta(0):
            raise InvalidArgument("must not be negative", field="window")
        sample = self.sampler.sample(min(window or DEFAULT_WINDOW, MAX_WINDOW))
        sample_time = Timestamp()
        sample_time.FromDatetime(self.clock.now())
        return agent_service_pb2.SampleUtilizationResponse(
            gpu_utilization_percent=sample.gpu_utilization_percent,
            running_attempts=sample.running_attempts,
            requests_since_last_sample=sample.requests_since_last_sample,
            sampler=sample.sampler_name,
            sample_time=sample_time,
            encoder_utilization_percent=sample.encoder_utilization_percent,
            decoder_utilization_percent=sample.decoder_utilization_percent,
            memory_utilization_percent=sample.memory_utilization_percent,
        )

    @_from_control_plane
    def StartJob(
        self, request: agent_service_pb2.AgentServiceStartJobRequest, context: Any
    ) -> agent_service_pb2.AgentServiceStartJobResponse:
        handled_at = self.monotonic()
        self.requests.add()
        return agent_service_pb2.AgentServiceStartJobResponse(
            already_running=self._start(request, context, handled_at)
        )

    @_from_control_plane
    def StartJobs(
        self, request: agent_service_pb2.StartJobsRequest, context: Any
    ) -> agent_service_pb2.StartJobsResponse:
        """Each attempt decided as StartJob would decide it, in order; a refusal answers for
        its own attempt only."""
        if len(request.jobs) > MAX_START_JOBS:
            raise InvalidArgument(f"at most {MAX_START_JOBS} attempts a call", field="jobs")
        handled_at = self.monotonic()
        self.requests.add()
        results = []
        for job in request.jobs:
            try:
                already = self._start(job, context, handled_at)
            except GpufleetError as exc:
                results.append(
                    agent_service_pb2.StartJobResult(
                        attempt_id=job.attempt_id, code=exc.code.value[0], message=str(exc)
                    )
                )
                continue
            results.append(
                agent_service_pb2.StartJobResult(attempt_id=job.attempt_id, already_running=already)
            )
        return agent_service_pb2.StartJobsResponse(results=results)

    def _start(
        self, request: agent_service_pb2.AgentServiceStartJobRequest, context: Any, handled_at: float
    ) -> bool:
        """Deliver one attempt to the worker; True when it was delivered before (idempotent).
        A start whose caller may have given up is refused, never delivered late
        (gpufleet.agent.pauses says how that happens)."""
        spec = spec_from_request(request, self.slots)
        with self._lock:
            if self.state.known(spec.attempt_id):
                return True
            complete, error = startup_status(self.state, self.supervisor, self.pipeline_command)
            if not complete:
                raise FailedPrecondition(f"machine start-up is not complete: {error or 'in progress'}")
            if not self.supervisor.alive():
                raise FailedPrecondition("the worker is not running on this machine")
            self._refuse_busy_slots(spec)
            self._refuse_if_given_up(context, handled_at)
            self._deliver(spec)
        return False

    def _refuse_if_given_up(self, context: Any, handled_at: float) -> None:
        """The last look before a start is delivered: the caller cancelled, its deadline
        passed while the handler waited, or this process was paused long enough that it may
        have given up before the call was read. (No context: called directly, not over gRPC.)"""
        if context is None:
            return
        if not context.is_active():
            raise DeadlineExceeded("the caller gave up on this start before it was delivered")
        remaining = context.time_remaining()
        if remaining is None or self.pauses is None:
            return
        now = self.monotonic()
        pause = self.pauses.last(handled_at)
        if may_have_outlived(pause, handled_at=handled_at, now=now, remaining_s=remaining):
            assert pause is not None
            raise DeadlineExceeded(
                f"this agent was paused for {pause.ended - pause.began:.1f} s just before the call "
                f"was read: the scheduler may have taken the start back; ask again"
            )

    def _refuse_busy_slots(self, spec: JobSpec) -> None:
        wanted = set(spec.occupies())
        for other in views.active_specs(self.state):
            if wanted & set(other.occupies()):
                raise FailedPrecondition(f"slot {spec.slot} is held by attempt {other.attempt_id}")

    def _deliver(self, spec: JobSpec) -> None:
        """Into the inbox, atomically and only once: link() refuses an existing name."""
        target = self.state.inbox_spec(spec.attempt_id)
        staging = self.state.inbox / f".{spec.attempt_id}.{os.getpid()}.{threading.get_ident()}"
        spec.save(staging)
        try:
            os.link(staging, target)
        except FileExistsError:
            pass
        finally:
            staging.unlink(missing_ok=True)

    @_from_control_plane
    def CancelJob(
        self, request: agent_service_pb2.AgentServiceCancelJobRequest, context: Any
    ) -> agent_service_pb2.AgentServiceCancelJobResponse:
        self.requests.add()
        if not request.attempt_id:
            raise InvalidArgument("is required", field="attempt_id")
        if not ATTEMPT_ID_PATTERN.match(request.attempt_id):
            return agent_service_pb2.AgentServiceCancelJobResponse(was_running=False)  # never accepted
        with self._lock:
            was_running = views.is_active(self.state, request.attempt_id)
            if was_running:
                atomic_write_text(
                    self.state.cancel_request(request.attempt_id),
                    f"{request.reason or 'cancelled by the control plane'}\n",
                )
        return agent_service_pb2.AgentServiceCancelJobResponse(was_running=was_running)

    @_from_control_plane
    def ReadJobLog(
        self, request: agent_service_pb2.ReadJobLogRequest, context: Any
    ) -> agent_service_pb2.ReadJobLogResponse:
        found = Violations()
        if not ATTEMPT_ID_PATTERN.match(request.attempt_id):
            found.add("attempt_id", "must be an attempt id", "INVALID_FORMAT")
        if request.offset < 0:
            found.add("offset", "must not be negative", "OUT_OF_RANGE")
        size = request.max_bytes or MAX_LOG_READ
        if not 0 < size <= MAX_LOG_READ:
            found.add("max_bytes", f"must be 1-{MAX_LOG_READ}", "OUT_OF_RANGE")
        found.raise_if_any()
        for folder in (self.state.attempts, self.state.finished, self.state.refused):
            path = AttemptFiles(folder / request.attempt_id).job_log
            try:
                with open(path, "rb") as log_file:
                    log_file.seek(request.offset)
                    data = log_file.read(size)
                    end = not log_file.read(1)
            except FileNotFoundError:
                continue
            return agent_service_pb2.ReadJobLogResponse(data=data, end_of_log=end)
        if self.state.known(request.attempt_id):  # accepted, not launched yet: nothing written
            return agent_service_pb2.ReadJobLogResponse(data=b"", end_of_log=True)
        raise NotFound(f"this machine never ran attempt {request.attempt_id!r}", field="attempt_id")

    @_from_control_plane
    def ListRunners(
        self, request: agent_service_pb2.ListRunnersRequest, context: Any
    ) -> agent_service_pb2.ListRunnersResponse:
        size = paging.page_size(request.page_size)
        after = paging.decode("runners", request.page_token)
        rows = [v for v in views.running(self.state) if after is None or v.spec.attempt_id > str(after)]
        page, more = rows[:size], len(rows) > size
        runners = []
        for view in page:
            runner = agent_service_pb2.Runner(
                attempt_id=view.spec.attempt_id,
                job_id=view.spec.job_id,
                slot=view.spec.slot,
                pid=view.runner_pid or 0,
            )
            if view.start_time is not None:
                runner.start_time.FromDatetime(view.start_time)
            runners.append(runner)
        token = paging.encode("runners", page[-1].spec.attempt_id) if more else ""
        return agent_service_pb2.ListRunnersResponse(runners=runners, next_page_token=token)
