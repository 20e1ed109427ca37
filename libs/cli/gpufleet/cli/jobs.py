"""``gpufleet submit | jobs | cancel``: the product backend's JobService from the command
line, jobs named by their id or any unique prefix of it."""

from __future__ import annotations

import argparse
import threading
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import grpc

from gpufleet.cli import ids, outcomes, output, watching
from gpufleet.cli.client import fail, job_stub, pages, run_client, system_now, unary
from gpufleet.cli.output import Col, say
from gpufleet.common import grpcclient
from gpufleet.common.errors import FailedPrecondition, GpufleetError, Unavailable
from gpufleet.v1 import job_pb2, job_service_pb2

# A WatchJob stream cut by a scheduler restart is opened again this many times in a row.
WATCH_RECONNECTS = 10


def parse_values(pairs: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"gpufleet: --set expects KEY=VALUE, got {pair!r}")
        values[key] = value
    return values


def state_name(state: int) -> str:
    return output.enum_short(job_pb2.JobState, state, "JOB_STATE_")


def attempt_state_name(state: int) -> str:
    return output.enum_short(job_pb2.AttemptState, state, "ATTEMPT_STATE_")


def list_jobs(args: argparse.Namespace, workspace: str = "", state: int = 0) -> list[job_pb2.Job]:
    return pages(
        job_stub(args).ListJobs,
        job_service_pb2.ListJobsRequest(page_size=200, workspace=workspace, state=state),  # type: ignore[arg-type]
        "jobs",
    )


def resolve_jobs(args: argparse.Namespace, prefixes: Sequence[str]) -> list[str | ids.IdError]:
    """Each job id or unique prefix as a whole id (an IdError where it names no single job)."""
    listed: dict[str, job_pb2.Job] = {}

    def every_id() -> list[str]:
        listed.update({j.job_id: j for j in list_jobs(args)})
        return list(listed)

    def describe(job_id: str) -> str:
        j = listed[job_id]
        return f"{job_id}  {state_name(j.state)}  {j.kind} for {j.workspace}"

    return ids.resolve_all(prefixes, every_id, "job", describe)


def resolve_job(args: argparse.Namespace, prefix: str) -> str:
    (found,) = resolve_jobs(args, [prefix])
    if isinstance(found, ids.IdError):
        raise found
    return found


def submit(args: argparse.Namespace) -> int:
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
    job: job_pb2.Job = unary(job_stub(args).SubmitJob, request)
    if not args.wait:
        if args.json:
            output.print_json(job)
        else:
            print(
                f"submitted job {job.job_id} ({job.kind} for {job.workspace}), state {state_name(job.state)}"
            )
        return 0
    say(f"submitted job {job.job_id} ({job.kind} for {job.workspace}); following it (Ctrl-C stops waiting)")
    try:
        ended = follow_job(args, job.job_id, lambda e: say(event_line(e)))
    except KeyboardInterrupt:
        say(f"stopped waiting: job {job.job_id} goes on (`gpufleet cancel {job.job_id[:8]}` ends it)")
        return outcomes.STOPPED_WAITING
    if args.json:
        output.print_json(ended)
    else:
        print(ending_line(ended))
    return outcomes.of_ended_job(ended) or 0


def event_line(event: job_pb2.JobEvent) -> str:
    at = event.event_time.ToDatetime()
    return f"  {at:%H:%M:%S}  {state_name(event.state)}" + (f": {event.message}" if event.message else "")


def ending_line(job: job_pb2.Job) -> str:
    what = f"job {job.job_id} {state_name(job.state).lower()}"
    tries = f" after {job.attempt_count} attempt(s)" if job.attempt_count else " without running"
    why = f": {job.status_message}" if job.status_message else ""
    return f"{what}{tries}, charged {output.money(job.charge_micros)}{why}"


def follow_job(
    args: argparse.Namespace,
    job_id: str,
    on_event: Callable[[job_pb2.JobEvent], None],
    until: Callable[[job_pb2.JobEvent], bool] = lambda e: False,
) -> job_pb2.Job:
    """Every state change of the job through WatchJob (its history first) until it ends or
    ``until`` an event holds; the job as of the last event. A stream cut by a restart of
    the scheduler is opened again after the last event shown (``after_sequence``), so no
    event is shown twice or missed."""
    after = 0
    cuts = 0
    pause = threading.Event()
    while True:
        request = job_service_pb2.WatchJobRequest(job_id=job_id, after_sequence=after)
        try:
            for event in job_stub(args).WatchJob(request):
                if event.sequence <= after:
                    continue  # never shown twice, whatever a server sends
                after = event.sequence
                cuts = 0
                on_event(event)
                if event.state in outcomes.TERMINAL_JOB_STATES or until(event):
                    last: job_pb2.Job = event.job
                    return last
        except grpc.RpcError as err:
            if not grpcclient.transport_failure(err) or cuts >= WATCH_RECONNECTS:
                raise grpcclient.wrap_rpc_error(err) from err
        cuts += 1
        pause.wait(min(0.5 * 2**cuts, 5.0))  # real time between two tries of a cut stream


def jobs(args: argparse.Namespace) -> int:
    if args.job:
        if args.watch:
            return fail("--watch shows the list; `gpufleet jobs ID` shows one job once")
        return job(args)
    try:
        state: Any = job_pb2.JobState.Value(f"JOB_STATE_{args.state.upper()}") if args.state else 0
    except ValueError:
        names = ", ".join(n.removeprefix("JOB_STATE_").lower() for n in job_pb2.JobState.keys()[1:])
        raise SystemExit(f"gpufleet: unknown --state {args.state!r}; one of {names}") from None
    if args.json:
        if args.watch:
            return fail("--watch is a view for a person; a script polls `gpufleet jobs --json`")
        output.print_json(list_jobs(args, args.workspace or "", state))
        return 0

    def render() -> str:
        return jobs_table(list_jobs(args, args.workspace or "", state), args)

    if args.watch:
        return watching.watch(render, args.interval, lambda: system_now(args))
    print(render())
    return 0


def jobs_table(rows: Sequence[job_pb2.Job], args: argparse.Namespace) -> str:
    now = system_now(args)
    return output.table(
        [
            "JOB",
            Col("WORKSPACE", flexible=True, min_width=14),
            Col("KIND", flexible=True, min_width=14),
            "STATE",
            Col("REASON", flexible=True, min_width=12),
            Col("ATTEMPTS", optional=True),
            Col("SLOT-S", optional=True),
            Col("CHARGE", optional=True),
            Col("CREATED", optional=True),
            Col("MESSAGE", flexible=True, min_width=12),
        ],
        [
            [
                j.job_id[:8],
                j.workspace,
                j.kind,
                state_name(j.state),
                reason_code(j) or "-",
                str(j.attempt_count),
                f"{j.slot_seconds:.0f}",
                output.money(j.charge_micros),
                output.when(j.create_time, now),
                j.status_message or "-",
            ]
            for j in rows
        ],
    )


def reason_code(j: job_pb2.Job) -> str:
    """A queued job's reason as a short word for a table's REASON column (as Slurm's squeue
    shows one), e.g. ``workspace_paused``; empty once it runs. ``jobs ID`` says it whole."""
    if j.state != job_pb2.JOB_STATE_QUEUED or not j.pending_reason:
        return ""
    return output.enum_short(job_pb2.PendingReason, j.pending_reason, "PENDING_REASON_").lower()


def waiting_reason(j: job_pb2.Job, now: datetime | None = None) -> str:
    """Why a queued job waits, as the fleet tick last decided, in words (empty once it runs),
    with the time a machine starting for it is expected to be ready."""
    if not (code := reason_code(j)):
        return ""
    text = j.pending_message or code
    if j.HasField("expected_ready_time") and now is not None:
        text += f" (expected ready {output.when(j.expected_ready_time, now)})"
    return text


def job(args: argparse.Namespace) -> int:
    """One job (``GetJob``) with its attempts, named by its id or a unique prefix of it."""
    job_id = resolve_job(args, args.job)
    j: job_pb2.Job = unary(job_stub(args).GetJob, job_service_pb2.GetJobRequest(job_id=job_id))
    if args.json:
        output.print_json(j)
        return 0
    now = system_now(args)
    reason = waiting_reason(j, now)
    print(
        output.fields(
            [
                ("job", j.job_id),
                ("workspace", f"{j.workspace}, pool {j.pool}, kind {j.kind}"),
                ("state", state_name(j.state) + (f": {j.status_message}" if j.status_message else "")),
                *([("waiting", reason)] if reason else []),
                ("created", output.when(j.create_time, now)),
                ("charged", f"{output.money(j.charge_micros)} for {j.slot_seconds:.0f} slot-seconds"),
                (
                    "retries used",
                    f"{j.failure_retries_used} for its own failures, {j.lost_retries_used} for lost machines"
                    + (f"; {j.disruptions_used} disruptions ridden out" if j.disruptions_used else ""),
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
                Col("MESSAGE", flexible=True, min_width=12),
            ],
            [
                [
                    a.attempt_id[:8],
                    a.machine_id[:8],
                    str(a.slot),
                    attempt_state_name(a.state),
                    output.when(a.start_time, now),
                    f"{a.slot_seconds:.0f}",
                    output.money(a.charge_micros) if a.charged else "not charged",
                    _checkpoint_label(a.started_from) if a.HasField("started_from") else "-",
                    a.status_message or "-",
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


def cancel(args: argparse.Namespace) -> int:
    """``gpufleet cancel JOB...``: each job ended (its running attempt killed and charged
    until now). Idempotent: a job already cancelled answers as cancelled, one that ended
    otherwise is said and left as it is. Exit 1 only if an id named no single job or a
    call failed."""
    stub = job_stub(args)
    status = 0
    done: list[job_pb2.Job] = []
    for prefix, found in zip(args.jobs, resolve_jobs(args, args.jobs), strict=True):
        if isinstance(found, ids.IdError):
            status = fail(str(found))
            continue
        request = job_service_pb2.CancelJobRequest(job_id=found, reason=args.reason or "")
        try:
            ended = cancel_one(stub, request)
        except Unavailable:
            raise  # said once, with the address tried
        except GpufleetError as exc:
            status = fail(f"job {prefix}: {exc.message}")
            continue
        done.append(ended)
    if args.json:
        output.print_json(done)
    return status if status else 0


def cancel_one(stub: Any, request: job_service_pb2.CancelJobRequest) -> job_pb2.Job:
    """The job after a cancel; one that had already ended is answered as it is."""
    try:
        ended: job_pb2.Job = unary(stub.CancelJob, request)
    except FailedPrecondition:
        ended = unary(stub.GetJob, job_service_pb2.GetJobRequest(job_id=request.job_id))
        if ended.state not in outcomes.TERMINAL_JOB_STATES:
            raise
        say(f"job {request.job_id} already {state_name(ended.state).lower()}: nothing to cancel")
        return ended
    say(f"job {request.job_id} cancelled")
    return ended


def add_parsers(client: Any) -> None:
    submit_ = client("submit", "submit a GPU job (--wait: follow it to its end)")
    submit_.epilog = f"With --wait, {outcomes.EXIT_CODES_HELP}."
    submit_.add_argument("--workspace", required=True)
    submit_.add_argument(
        "--kind", default="short_episode", help="see `gpufleet kinds` (default short_episode)"
    )
    submit_.add_argument("--pool", default="", help="default: the kind's default pool (`gpufleet kinds`)")
    submit_.add_argument(
        "--pipeline-version", default="", help="default: the kind's default version (`gpufleet kinds`)"
    )
    submit_.add_argument("--request-id", default=None, help="idempotency key (default: a new one)")
    submit_.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a tenant value")
    submit_.add_argument(
        "--wait",
        action="store_true",
        help="follow the job (WatchJob) until it ends, each state change on stderr; the exit "
        "status says how it ended (below)",
    )
    submit_.set_defaults(func=_run(submit))

    jobs_ = client("jobs", "list jobs (REASON: why a queued job waits), or show one with its attempts")
    jobs_.add_argument("job", nargs="?", default=None, help="a job id or a unique prefix of it")
    jobs_.add_argument("--workspace", default=None)
    jobs_.add_argument("--state", default=None, help="e.g. queued, running, succeeded")
    watching_flags(jobs_)
    jobs_.set_defaults(func=_run(jobs))

    cancel_ = client("cancel", "cancel jobs: each running attempt is killed (and charged until now)")
    cancel_.epilog = (
        "Idempotent: cancelling a cancelled job again answers it as it is, and a job that "
        "already ended otherwise is reported and left alone (exit 0). Exit status 1 when an "
        "id names no single job (an ambiguous prefix lists its candidates) or a call fails; "
        "the other jobs named are cancelled all the same."
    )
    cancel_.add_argument("jobs", nargs="+", metavar="JOB", help="job ids or unique prefixes")
    cancel_.add_argument("--reason", default=None, help="recorded with the job (at most 1024 characters)")
    cancel_.set_defaults(func=_run(cancel))


def watching_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--watch", action="store_true", help="redraw every --interval seconds until Ctrl-C")
    parser.add_argument(
        "--interval",
        type=float,
        default=watching.DEFAULT_INTERVAL_S,
        help=f"seconds between two looks with --watch (default {watching.DEFAULT_INTERVAL_S:g})",
    )


def _run(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    return lambda a: run_client(func, a)
