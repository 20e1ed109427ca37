"""``gpufleet logs JOB [--attempt A] [--follow]``: a job's log as its machine kept it, its
tokens already redacted there.

With --follow it is a wait as well as a read: a job that has not started yet is waited for
(through WatchJob, its state changes said on stderr), the attempt's log is printed as it
grows, and the attempt's outcome ends it — on stderr, and in the exit status
(:mod:`gpufleet.cli.outcomes`), so ``gpufleet logs --follow J && next-step`` does what it reads.
"""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from gpufleet.cli import ids, outcomes, output
from gpufleet.cli.client import job_stub, run_client, unary
from gpufleet.cli.jobs import attempt_state_name, event_line, follow_job, resolve_job, state_name
from gpufleet.cli.output import say
from gpufleet.common.errors import NotFound
from gpufleet.v1 import job_pb2, job_service_pb2

# Real time between two looks at a running attempt's log.
FOLLOW_PAUSE_S = 1.0


def logs(args: argparse.Namespace) -> int:
    try:
        return _logs(args)
    except KeyboardInterrupt:
        say("stopped following: the job goes on")
        return outcomes.STOPPED_WAITING


def _logs(args: argparse.Namespace) -> int:
    job_id = resolve_job(args, args.job)
    stub = job_stub(args)
    job: job_pb2.Job = unary(stub.GetJob, job_service_pb2.GetJobRequest(job_id=job_id))
    attempt_id = resolve_attempt(job, args.attempt) if args.attempt else ""
    if args.follow and not job.attempts:
        job = wait_for_first_attempt(args, job)
        if not job.attempts:  # it ended without running (cancelled, or its queue wait ran out)
            say(f"job {job_id} {state_name(job.state).lower()} without running: {job.status_message or '-'}")
            return outcomes.of_ended_job(job) or outcomes.FAILED
    attempt_id = copy_log(stub, job_id, attempt_id, args.follow)
    if not args.follow:
        return 0
    job = unary(stub.GetJob, job_service_pb2.GetJobRequest(job_id=job_id))
    attempt = next(a for a in job.attempts if a.attempt_id == attempt_id)
    say(attempt_ending(attempt, job))
    return outcomes.of_attempt(attempt.state) or 0


def resolve_attempt(job: job_pb2.Job, prefix: str) -> str:
    def describe(attempt_id: str) -> str:
        a = next(a for a in job.attempts if a.attempt_id == attempt_id)
        return f"{attempt_id}  {attempt_state_name(a.state)}"

    return ids.resolve(prefix, [a.attempt_id for a in job.attempts], "attempt of this job", describe)


def wait_for_first_attempt(args: argparse.Namespace, job: job_pb2.Job) -> job_pb2.Job:
    """The job once it runs (an attempt has started on its machine) or has ended."""
    say(f"job {job.job_id} has not started yet; waiting for its first attempt (Ctrl-C stops waiting)")
    ended = follow_job(
        args,
        job.job_id,
        lambda e: say(event_line(e) + (f" — {e.job.pending_message}" if e.job.pending_message else "")),
        until=lambda e: e.state == job_pb2.JOB_STATE_RUNNING,
    )
    return unary(job_stub(args).GetJob, job_service_pb2.GetJobRequest(job_id=ended.job_id))  # type: ignore[no-any-return]


def copy_log(stub: Any, job_id: str, attempt_id: str, follow: bool) -> str:
    """Write the attempt's log (the newest when none is named) to stdout; with ``follow``
    until the attempt has ended. Which attempt it was."""
    out = sys.stdout.buffer
    offset = 0
    pause = threading.Event()
    while True:
        request = job_service_pb2.GetJobLogRequest(job_id=job_id, attempt_id=attempt_id, offset=offset)
        try:
            part: job_service_pb2.GetJobLogResponse = unary(stub.GetJobLog, request)
        except NotFound:
            if not (follow and attempt_id):
                raise
            # Dispatched but not yet known to its machine: nothing written so far.
            part = job_service_pb2.GetJobLogResponse(
                attempt_id=attempt_id, next_offset=offset, end_of_log=True
            )
        out.write(part.data)
        out.flush()
        offset = part.next_offset
        attempt_id = part.attempt_id  # the same attempt to its end, whatever starts after it
        if part.end_of_log and (part.attempt_ended or not follow):
            return attempt_id
        if part.end_of_log:
            pause.wait(FOLLOW_PAUSE_S)


def attempt_ending(attempt: job_pb2.Attempt, job: job_pb2.Job) -> str:
    state = attempt_state_name(attempt.state).lower().replace("_", " ")
    exit_code = f" (exit {attempt.exit_code})" if attempt.exit_code else ""
    why = f": {attempt.status_message}" if attempt.status_message else ""
    charge = output.money(attempt.charge_micros) if attempt.charged else "not charged"
    text = f"attempt {attempt.attempt_id[:8]} {state}{exit_code}{why} ({charge})"
    if job.state not in outcomes.TERMINAL_JOB_STATES:
        return f"{text}; job {job.job_id[:8]} is {state_name(job.state)} (another attempt follows)"
    return f"{text}; job {job.job_id[:8]} {state_name(job.state).lower()}"


def add_parsers(client: Any) -> None:
    job_log = client("logs", "a job's log (its tokens redacted on the machine); --follow: to its end")
    job_log.epilog = (
        "With --follow, a job that has not started is waited for, the log is printed as it "
        f"grows, and the attempt's outcome ends it; {outcomes.EXIT_CODES_HELP}."
    )
    job_log.add_argument("job", help="a job id or a unique prefix of it")
    job_log.add_argument("--attempt", default=None, help="one attempt, by id or prefix (default: the newest)")
    job_log.add_argument(
        "--follow", action="store_true", help="wait for the job to start, then print until its attempt ends"
    )
    job_log.set_defaults(func=lambda a: run_client(logs, a))
