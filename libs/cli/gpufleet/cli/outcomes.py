"""Exit statuses from how a job or an attempt ended, for ``submit --wait`` and
``logs --follow``: a script tells success from each kind of failure without parsing text.

0 succeeded; 1 the command itself failed (refused, unknown id, nothing answering);
2 bad usage (argparse); 3 failed (its own code: an exit, a kill, OOM at its memory limit);
4 timed out; 5 cancelled; 6 ended by the platform, not by the job (its machine was lost,
or a failure on our side: never charged, and the job is retried when its budget allows);
130 stopped waiting (Ctrl-C) — the job goes on.
"""

from __future__ import annotations

from gpufleet.v1 import job_pb2

SUCCEEDED = 0
FAILED = 3
TIMED_OUT = 4
CANCELLED = 5
PLATFORM = 6
STOPPED_WAITING = 130

EXIT_CODES_HELP = (
    "exit status: 0 succeeded, 1 the command failed (refused, unknown id, no answer), "
    "3 failed, 4 timed out, 5 cancelled, 6 ended by the platform (machine lost, failure on "
    "our side; not charged), 130 stopped waiting with Ctrl-C (the job goes on)"
)

_JOB: dict[int, int] = {
    job_pb2.JOB_STATE_SUCCEEDED: SUCCEEDED,
    job_pb2.JOB_STATE_FAILED: FAILED,
    job_pb2.JOB_STATE_TIMED_OUT: TIMED_OUT,
    job_pb2.JOB_STATE_CANCELLED: CANCELLED,
}
_ATTEMPT: dict[int, int] = {
    job_pb2.ATTEMPT_STATE_SUCCEEDED: SUCCEEDED,
    job_pb2.ATTEMPT_STATE_FAILED: FAILED,
    job_pb2.ATTEMPT_STATE_TIMED_OUT: TIMED_OUT,
    job_pb2.ATTEMPT_STATE_CANCELLED: CANCELLED,
    job_pb2.ATTEMPT_STATE_LOST: PLATFORM,
    job_pb2.ATTEMPT_STATE_INFRA_ERROR: PLATFORM,
}
TERMINAL_JOB_STATES = frozenset(_JOB)
LIVE_ATTEMPT_STATES = frozenset({job_pb2.ATTEMPT_STATE_STARTING, job_pb2.ATTEMPT_STATE_RUNNING})


def of_job(state: int) -> int | None:
    """The exit status for a job in ``state``; None while it has not ended."""
    return _JOB.get(state)


def of_ended_job(job: job_pb2.Job) -> int | None:
    """The exit status for ``job`` as a whole: a job FAILED because its last attempt was
    ended by the platform (its retry budget for our failures spent) says 6, not 3 — the
    job's own code did not fail. None while it has not ended."""
    status = of_job(job.state)
    if status == FAILED and job.attempts and of_attempt(job.attempts[-1].state) == PLATFORM:
        return PLATFORM
    return status


def of_attempt(state: int) -> int | None:
    """The exit status for an attempt in ``state``; None while it runs."""
    return _ATTEMPT.get(state)
