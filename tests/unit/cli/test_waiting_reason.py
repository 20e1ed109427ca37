"""Why a queued job waits, as the CLI shows it: a short word in the jobs table's REASON column
(as squeue shows one), the fleet tick's words and the expected ready time in `jobs ID`, and
nothing once the job runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp

from gpufleet.cli.jobs import reason_code, waiting_reason
from gpufleet.v1 import job_pb2

NOW = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def queued(reason: int, message: str = "", ready_in_s: float | None = None) -> job_pb2.Job:
    job = job_pb2.Job(state=job_pb2.JOB_STATE_QUEUED, pending_reason=reason, pending_message=message)
    if ready_in_s is not None:
        ready = Timestamp()
        ready.FromDatetime(NOW + timedelta(seconds=ready_in_s))
        job.expected_ready_time.CopyFrom(ready)
    return job


def test_the_table_shows_the_reason_as_a_short_word() -> None:
    job = queued(job_pb2.PENDING_REASON_WORKSPACE_PAUSED, "workspace acme-studio is paused")
    assert reason_code(job) == "workspace_paused"


def test_the_detail_view_says_it_in_words_with_the_expected_ready_time() -> None:
    job = queued(job_pb2.PENDING_REASON_WAITING_FOR_CAPACITY, "a machine is starting for it", ready_in_s=180)
    assert waiting_reason(job, NOW) == "a machine is starting for it (expected ready in 3m)"
    # With no words from the tick, the short word stands in.
    assert waiting_reason(queued(job_pb2.PENDING_REASON_POOL_AT_CEILING), NOW) == "pool_at_ceiling"


def test_a_job_that_runs_or_has_no_reason_shows_none() -> None:
    running = queued(job_pb2.PENDING_REASON_WORKSPACE_PAUSED)
    running.state = job_pb2.JOB_STATE_RUNNING
    assert reason_code(running) == "" and waiting_reason(running, NOW) == ""
    assert reason_code(queued(job_pb2.PENDING_REASON_UNSPECIFIED)) == ""
