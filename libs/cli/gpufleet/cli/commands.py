"""``gpufleet submit | jobs | machines``: talk to a running system's scheduler."""

from __future__ import annotations

import argparse
import sys
import threading
from datetime import UTC, datetime
from typing import Any

from gpufleet.cli import credentials, output
from gpufleet.common import grpcclient
from gpufleet.common.errors import GpufleetError, Unavailable
from gpufleet.common.trust.identity import Role
from gpufleet.v1 import (
    fleet_service_pb2,
    fleet_service_pb2_grpc,
    job_pb2,
    job_service_pb2,
    job_service_pb2_grpc,
    machine_pb2,
)

TIMEOUT_S = 10.0


def _job_stub(args: argparse.Namespace) -> job_service_pb2_grpc.JobServiceStub:
    return job_service_pb2_grpc.JobServiceStub(credentials.channel(args, args.scheduler, Role.SCHEDULER))


def _fleet_stub(args: argparse.Namespace) -> fleet_service_pb2_grpc.FleetServiceStub:
    return fleet_service_pb2_grpc.FleetServiceStub(credentials.channel(args, args.scheduler, Role.SCHEDULER))


def system_now(args: argparse.Namespace) -> datetime:
    """The system's own time (FleetService.GetSystemTime), what ages are counted against;
    this machine's clock only when the scheduler cannot say (an older one)."""
    try:
        reply = grpcclient.call(
            _fleet_stub(args).GetSystemTime,
            fleet_service_pb2.GetSystemTimeRequest(),
            timeout=5.0,
            idempotent=True,
        )
    except GpufleetError:
        return datetime.now(UTC)
    return reply.now.ToDatetime(tzinfo=UTC)  # type: ignore[no-any-return]


def parse_values(pairs: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"gpufleet: --set expects KEY=VALUE, got {pair!r}")
        values[key] = value
    return values


def submit(args: argparse.Namespace) -> int:
    import uuid

    request = job_service_pb2.SubmitJobRequest(
        request_id=args.request_id or f"cli-{uuid.uuid4()}",
        job=job_pb2.Job(
            workspace=args.workspace,
            pool=args.pool,
            kind=args.kind,
            pipeline_version=args.pipeline_version,
            tenant_values=parse_values(args.set),
        ),
    )
    job = grpcclient.call(_job_stub(args).SubmitJob, request, timeout=TIMEOUT_S, idempotent=True)
    if args.json:
        output.print_json(job)
    else:
        print(
            f"submitted job {job.job_id} ({job.kind} for {job.workspace}), state "
            f"{output.enum_short(job_pb2.JobState, job.state, 'JOB_STATE_')}"
        )
    return 0


def pages(method: Any, request: Any, field: str, limit: int | None = None) -> list[Any]:
    """Every item of a paged List (or the first ``limit``), following next_page_token."""
    items: list[Any] = []
    while True:
        resp = grpcclient.call(method, request, timeout=TIMEOUT_S, idempotent=True)
        items.extend(getattr(resp, field))
        if not resp.next_page_token or (limit is not None and len(items) >= limit):
            return items[:limit] if limit is not None else items
        request.page_token = resp.next_page_token


def _all_jobs(args: argparse.Namespace) -> list[job_pb2.Job]:
    stub = _job_stub(args)
    try:
        state: Any = job_pb2.JobState.Value(f"JOB_STATE_{args.state.upper()}") if args.state else 0
    except ValueError:
        names = ", ".join(n.removeprefix("JOB_STATE_").lower() for n in job_pb2.JobState.keys()[1:])
        raise SystemExit(f"gpufleet: unknown --state {args.state!r}; one of {names}") from None
    return list(
        pages(
            stub.ListJobs,
            job_service_pb2.ListJobsRequest(page_size=200, workspace=args.workspace or "", state=state),
            "jobs",
        )
    )


def jobs(args: argparse.Namespace) -> int:
    if getattr(args, "job", None):
        return job(args)
    rows = _all_jobs(args)
    if args.json:
        output.print_json(rows)
        return 0
    now = system_now(args)
    print(
        output.table(
            ["JOB", "WORKSPACE", "KIND", "STATE", "ATTEMPTS", "SLOT-S", "CHARGE", "CREATED", "MESSAGE"],
            [
                [
                    j.job_id[:8],
                    j.workspace,
                    j.kind,
                    output.enum_short(job_pb2.JobState, j.state, "JOB_STATE_"),
                    str(j.attempt_count),
                    f"{j.slot_seconds:.0f}",
                    output.money(j.charge_micros),
                    output.when(j.create_time, now),
                    j.status_message[:40],
                ]
                for j in rows
            ],
        )
    )
    return 0


def deregister(args: argparse.Namespace, stub: fleet_service_pb2_grpc.FleetServiceStub) -> int:
    """``gpufleet machines deregister ID``: a self-registered box leaves the fleet."""
    target = getattr(args, "target", None)
    if not target:
        raise SystemExit("gpufleet: machines deregister needs a machine id")
    gone: machine_pb2.Machine = grpcclient.call(
        stub.DeregisterMachine,
        fleet_service_pb2.DeregisterMachineRequest(machine_id=target),
        timeout=TIMEOUT_S,
        idempotent=True,
    )
    if args.json:
        output.print_json(gone)
    else:
        print(f"machine {gone.machine_id} deregistered: it is no longer listed, counted or given jobs")
    return 0


def machines(args: argparse.Namespace) -> int:
    stub = _fleet_stub(args)
    if args.machine == "deregister":
        return deregister(args, stub)
    if getattr(args, "target", None):
        raise SystemExit(
            f"gpufleet: unexpected argument {args.target!r} (did you mean `machines deregister`?)"
        )
    if args.machine:
        return machine(args, stub)
    rows: list[machine_pb2.Machine] = pages(
        stub.ListMachines,
        fleet_service_pb2.ListMachinesRequest(page_size=200, include_destroyed=args.all),
        "machines",
    )
    if args.json:
        output.print_json(rows)
        return 0
    now = system_now(args)
    print(
        output.table(
            [
                "MACHINE",
                "POOL",
                "OFFERING",
                "STATE",
                "BY",
                "INTENT",
                "SLOTS",
                "WORKER",
                "PROBE",
                "PROVIDER",
                "STOP DUE",
                "DESTROY DUE",
                "FOR FILM",
                "FLAGS",
            ],
            [
                [
                    m.machine_id[:8],
                    m.pool,
                    m.offering.offering_id or m.offering.instance_type,
                    output.enum_short(machine_pb2.MachineState, m.state, "MACHINE_STATE_"),
                    m.state_changed_by or "-",
                    output.enum_short(machine_pb2.MachineIntent, m.intent, "MACHINE_INTENT_"),
                    f"{m.slots_busy}/{m.slots_total}",
                    output.when(m.liveness.worker_report_at, now),
                    output.when(m.liveness.probe_ok_at, now),
                    output.when(m.liveness.provider_seen_at, now),
                    output.when(m.idle_timers.stop_due_at, now),
                    output.when(m.idle_timers.destroy_due_at, now),
                    m.earmarked_for_job[:8] or "-",
                    ",".join(
                        f
                        for f, on in (
                            ("lost", m.lost),
                            ("cordoned", m.cordoned),
                            ("registered", m.origin == machine_pb2.MACHINE_ORIGIN_REGISTERED),
                        )
                        if on
                    )
                    or "-",
                ]
                for m in rows
            ],
        )
    )
    return 0


def job(args: argparse.Namespace) -> int:
    """One job (``GetJob``) with its attempts, named by its id or a unique prefix of it."""
    job_id = args.job
    if len(job_id) < 36:
        matches = [j.job_id for j in _all_jobs(args) if j.job_id.startswith(job_id)]
        if len(matches) != 1:
            what = "no job" if not matches else f"{len(matches)} jobs"
            print(f"gpufleet: {what} with an id starting {job_id!r}", file=sys.stderr)
            return 1
        job_id = matches[0]
    stub = _job_stub(args)
    j = grpcclient.call(
        stub.GetJob, job_service_pb2.GetJobRequest(job_id=job_id), timeout=TIMEOUT_S, idempotent=True
    )
    if args.json:
        output.print_json(j)
        return 0
    now = system_now(args)
    print(
        output.fields(
            [
                ("job", j.job_id),
                ("workspace", f"{j.workspace}, pool {j.pool}, kind {j.kind}"),
                (
                    "state",
                    output.enum_short(job_pb2.JobState, j.state, "JOB_STATE_")
                    + (f": {j.status_message}" if j.status_message else ""),
                ),
                ("created", output.when(j.create_time, now)),
                ("charged", f"{output.money(j.charge_micros)} for {j.slot_seconds:.0f} slot-seconds"),
                (
                    "retries used",
                    f"{j.failure_retries_used} for its own failures, {j.lost_retries_used} for lost machines",
                ),
            ]
        )
    )
    print()
    print(
        output.table(
            [
                "ATTEMPT",
                "MACHINE",
                "SLOT",
                "STATE",
                "STARTED",
                "SLOT-S",
                "CHARGE",
                "FROM CHECKPOINT",
                "MESSAGE",
            ],
            [
                [
                    a.attempt_id[:8],
                    a.machine_id[:8],
                    str(a.slot),
                    output.enum_short(job_pb2.AttemptState, a.state, "ATTEMPT_STATE_"),
                    output.when(a.start_time, now),
                    f"{a.slot_seconds:.0f}",
                    output.money(a.charge_micros) if a.charged else "not charged",
                    _checkpoint_label(a.started_from) if a.HasField("started_from") else "-",
                    a.status_message[:40],
                ]
                for a in j.attempts
            ],
        )
    )
    return 0


def _checkpoint_label(c: job_pb2.Checkpoint) -> str:
    if not c.sequence:
        return c.checkpoint_id[:8]
    return f"#{c.sequence} by {c.attempt_id[:8]} ({c.size_bytes} B)"


def machine(args: argparse.Namespace, stub: fleet_service_pb2_grpc.FleetServiceStub) -> int:
    """One machine (``GetMachine``), named by its id or a unique prefix of it."""
    machine_id = args.machine
    if len(machine_id) < 36:
        listed = pages(
            stub.ListMachines,
            fleet_service_pb2.ListMachinesRequest(page_size=200, include_destroyed=True),
            "machines",
        )
        matches = [m.machine_id for m in listed if m.machine_id.startswith(machine_id)]
        if len(matches) != 1:
            what = "no machine" if not matches else f"{len(matches)} machines"
            print(f"gpufleet: {what} with an id starting {machine_id!r}", file=sys.stderr)
            return 1
        machine_id = matches[0]
    m = grpcclient.call(
        stub.GetMachine,
        fleet_service_pb2.GetMachineRequest(machine_id=machine_id),
        timeout=TIMEOUT_S,
        idempotent=True,
    )
    if args.json:
        output.print_json(m)
    else:
        print(machine_detail(m, system_now(args)))
    return 0


def machine_detail(m: machine_pb2.Machine, now: datetime) -> str:
    state = output.enum_short(machine_pb2.MachineState, m.state, "MACHINE_STATE_")
    intent = output.enum_short(machine_pb2.MachineIntent, m.intent, "MACHINE_INTENT_")
    changed = f"{output.when(m.state_changed_at, now)} by {m.state_changed_by or '?'}" + (
        f": {m.state_reason}" if m.state_reason else ""
    )
    live = m.liveness
    return output.fields(
        [
            ("machine", m.machine_id),
            (
                "pool",
                f"{m.pool or '-'}, offering {m.offering.offering_id or m.offering.instance_type or '-'}",
            ),
            ("state", f"{state}, intent {intent}"),
            ("changed", changed),
            ("slots", f"{m.slots_busy}/{m.slots_total} busy"),
            (
                "held for",
                f"film {m.earmarked_for_job} since {output.when(m.earmarked_at, now)}"
                if m.earmarked_for_job
                else "-",
            ),
            (
                "liveness",
                f"worker {output.when(live.worker_report_at, now)}, "
                f"probe {output.when(live.probe_ok_at, now)}, "
                f"provider {output.when(live.provider_seen_at, now)}",
            ),
            (
                "idle timers",
                f"stop {output.when(m.idle_timers.stop_due_at, now)}, "
                f"destroy {output.when(m.idle_timers.destroy_due_at, now)}",
            ),
        ]
    )


def logs(args: argparse.Namespace) -> int:
    """``gpufleet logs JOB [--attempt A] [--follow]``: the job's log as its machine kept it,
    its tokens already redacted there; with --follow, until the attempt ends."""
    stub = _job_stub(args)
    out = sys.stdout.buffer
    offset = 0
    pause = threading.Event()
    while True:
        part: job_service_pb2.GetJobLogResponse = grpcclient.call(
            stub.GetJobLog,
            job_service_pb2.GetJobLogRequest(job_id=args.job, attempt_id=args.attempt or "", offset=offset),
            timeout=TIMEOUT_S,
            idempotent=True,
        )
        out.write(part.data)
        out.flush()
        offset = part.next_offset
        if part.end_of_log and (part.attempt_ended or not args.follow):
            return 0
        if part.end_of_log:
            pause.wait(1.0)  # real time between looks at a running job's log


def run_client(func: object, args: argparse.Namespace, address: str | None = None) -> int:
    """Run a client command; a gRPC error becomes one clear line and exit status 1."""
    try:
        return int(func(args))  # type: ignore[operator]
    except GpufleetError as exc:
        where = f" (field {exc.field})" if exc.field else ""
        print(f"gpufleet: {exc.message}{where}", file=sys.stderr)
        if isinstance(exc, Unavailable):
            print(
                f"gpufleet: is the system running at {args.scheduler}? Start it with `gpufleet up`.",
                file=sys.stderr,
            )
        return 1
