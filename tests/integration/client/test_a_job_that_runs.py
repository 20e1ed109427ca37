"""A backend's whole errand through the client, on a real system that runs the job (every
service a real process, local machines, the shared clock moved by the test): submit, watch
it run and succeed, read its log page by page, see what it cost."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.client import Client, NotFound
from gpufleet.v1 import job_pb2
from tests.e2e.fleet import Fleet

pytestmark = pytest.mark.e2e


def test_submit_watch_to_success_read_the_log_and_the_usage(system: Fleet, backend_certs: Path) -> None:
    with Client(f"127.0.0.1:{system.scheduler_port}", backend_certs) as fleet:
        fleet.create_workspace("film-club", "studio")
        job = fleet.submit_job("film-club", "short_episode", tenant_values={"duration_s": "10"})
        with pytest.raises(NotFound) as not_yet:
            fleet.get_job_log(job.job_id)
        assert not_yet.value.field == "job_id"  # the job has not run yet

        seen: list[job_pb2.JobEvent] = []
        watcher = threading.Thread(target=lambda: seen.extend(fleet.watch_job(job.job_id)), daemon=True)
        watcher.start()
        system.advance_until(lambda: not watcher.is_alive(), max_virtual_s=900, what="the watch to end")

        states = [e.state for e in seen]
        assert states[0] == job_pb2.JOB_STATE_QUEUED and states[-1] == job_pb2.JOB_STATE_SUCCEEDED
        assert job_pb2.JOB_STATE_RUNNING in states
        done = seen[-1].job
        assert done.attempts and done.attempts[-1].state == job_pb2.ATTEMPT_STATE_SUCCEEDED

        whole = fleet.get_job_log(job.job_id)
        assert whole.end_of_log and whole.attempt_ended and whole.data
        pages = list(fleet.read_job_log(job.job_id, max_bytes=97))
        assert len(pages) > 1 and b"".join(p.data for p in pages) == whole.data
        assert {p.attempt_id for p in pages} == {done.attempts[-1].attempt_id}

        # From the system clock's start (2026-06-01 09:00) until its now.
        usage = fleet.get_usage("film-club", datetime(2026, 6, 1, tzinfo=UTC))
        assert usage.total.attempts == 1 and usage.total.charge_micros == done.charge_micros > 0
