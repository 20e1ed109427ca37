"""The blocking client against a real scheduler process, real mutual TLS with the folder
`gpufleet certs issue --role backend` wrote, and real PostgreSQL: what a backend does with
it, each answer checked as the backend would read it."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.client import (
    AlreadyExists,
    Client,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from gpufleet.v1 import job_pb2
from tests.integration.client.conftest import Scheduler, issue_certs, watch_in_thread

BAD_SUBMIT_FIELDS = [
    ("request_id", "INVALID_FORMAT"),
    ("job.workspace", "REQUIRED"),
    ("job.pool", "INVALID_FORMAT"),
    ("job.kind", "REQUIRED"),
    ("job.pipeline_version", "INVALID_FORMAT"),
    ("job.tenant_values['bad key!']", "INVALID_FORMAT"),
    ("job.tenant_values['huge']", "TOO_LARGE"),
]


def test_one_key_submitted_twice_is_one_job(scheduler: Scheduler, backend_certs: Path) -> None:
    with Client(scheduler.address, backend_certs) as fleet:
        fleet.create_workspace("studio-7", "studio")
        first = fleet.submit_job("studio-7", "clip", request_id="order-42", tenant_values={"topic": "otters"})
        again = fleet.submit_job("studio-7", "clip", request_id="order-42", tenant_values={"topic": "otters"})
        assert again.job_id == first.job_id
        assert [j.job_id for j in fleet.list_jobs(workspace="studio-7")] == [first.job_id]
        # The kind's catalogue defaults were filled in; the key is the one given.
        assert (first.pool, first.pipeline_version, first.request_id) == ("l4", "2026.12.0", "order-42")
        assert dict(first.tenant_values) == {"topic": "otters"}

        # Without a key, each call is its own submit with its own key.
        one, two = fleet.submit_job("studio-7", "clip"), fleet.submit_job("studio-7", "clip")
        assert one.job_id != two.job_id and one.request_id != two.request_id
        assert len(list(fleet.list_jobs(workspace="studio-7"))) == 3

        # The same key with other content is refused, with the server's reason.
        with pytest.raises(AlreadyExists) as reused:
            fleet.submit_job("studio-7", "film", request_id="order-42")
        assert (reused.value.reason, reused.value.domain) == ("REQUEST_ID_REUSED", "gpufleet.dev")


def test_lists_page_through_every_page(scheduler: Scheduler, backend_certs: Path) -> None:
    with Client(scheduler.address, backend_certs) as fleet:
        for name in ("ws-c", "ws-a", "ws-b"):
            fleet.create_workspace(name, "creator")
        submitted = [fleet.submit_job("ws-a", "clip").job_id for _ in range(7)]

        # Three pages of at most three: every job once, oldest first.
        assert [j.job_id for j in fleet.list_jobs(workspace="ws-a", page_size=3)] == submitted
        assert [j.job_id for j in fleet.list_jobs(workspace="ws-b", page_size=3)] == []
        queued = fleet.list_jobs(state=job_pb2.JOB_STATE_QUEUED, pool="l4", page_size=2)
        assert [j.job_id for j in queued] == submitted
        names = [w.workspace_id for w in fleet.list_workspaces(page_size=2)]
        assert names == sorted(names) and {"ws-a", "ws-b", "ws-c"} <= set(names)
        assert [k.kind_id for k in fleet.list_job_kinds(page_size=2)] == ["clip", "film", "short_episode"]
        assert [p.plan_id for p in fleet.list_plans(page_size=1)] == ["creator", "studio"]
        assert [p.pool_id for p in fleet.list_pools(page_size=1)] == ["l4"]


def test_a_bad_request_raises_the_typed_error_naming_every_bad_field(
    scheduler: Scheduler, backend_certs: Path
) -> None:
    with Client(scheduler.address, backend_certs) as fleet:
        with pytest.raises(InvalidArgument) as bad:
            fleet.submit_job(
                "",
                "",
                pool="Not A Pool!",
                pipeline_version="1.0; rm -rf /",
                tenant_values={"bad key!": "v", "fine": "v", "huge": "x" * 10_000},
                request_id="has spaces",
            )
        error = bad.value
        assert [(v.field, v.reason) for v in error.violations] == BAD_SUBMIT_FIELDS
        assert all(v.description for v in error.violations)
        assert (error.field, error.reason, error.domain) == ("request_id", "INVALID_REQUEST", "gpufleet.dev")
        assert error.retry_after is None  # the same request cannot pass later
        assert "job.pipeline_version" in str(error)
        with pytest.raises(InvalidArgument) as negative:
            list(fleet.list_jobs(page_size=-1))
        assert negative.value.field == "page_size"

        # Well formed, but naming what is not there, or what may not take jobs now.
        with pytest.raises(NotFound) as unknown:
            fleet.submit_job("nobody", "clip")
        assert (unknown.value.reason, unknown.value.field) == ("UNKNOWN_WORKSPACE", "job.workspace")
        fleet.create_workspace("resting", "creator", paused=True)
        with pytest.raises(FailedPrecondition) as paused:
            fleet.submit_job("resting", "clip")
        assert (paused.value.reason, paused.value.field) == ("WORKSPACE_PAUSED", "job.workspace")


def test_cancel_get_workspaces_and_usage(scheduler: Scheduler, backend_certs: Path) -> None:
    with Client(scheduler.address, backend_certs) as fleet:
        created = fleet.create_workspace("studio-9", "creator", request_id="make-studio-9")
        assert fleet.create_workspace("studio-9", "creator", request_id="make-studio-9") == created
        job = fleet.submit_job("studio-9", "short_episode")

        cancelled = fleet.cancel_job(f"jobs/{job.job_id}", reason="changed my mind")
        assert cancelled.state == job_pb2.JOB_STATE_CANCELLED
        assert fleet.cancel_job(job.job_id).state == job_pb2.JOB_STATE_CANCELLED  # idempotent
        assert fleet.get_job(job.job_id).state == job_pb2.JOB_STATE_CANCELLED
        with pytest.raises(NotFound):
            fleet.get_job("00000000-0000-0000-0000-000000000000")

        paused = fleet.update_workspace("studio-9", active=False)
        assert (paused.active, paused.plan) == (False, "creator")
        moved = fleet.update_workspace("studio-9", plan="studio", active=True)
        assert (moved.active, moved.plan) == (True, "studio")
        assert fleet.get_workspace("workspaces/studio-9") == moved

        start = datetime.now(UTC) - timedelta(hours=1)
        usage = fleet.get_usage("studio-9", start)
        assert (usage.workspace_id, usage.total.attempts, usage.total.charge_micros) == ("studio-9", 0, 0)
        assert usage.start_time.ToDatetime(tzinfo=UTC) == start
        with pytest.raises(ValueError, match="start: a timezone-aware datetime"):
            fleet.get_usage("studio-9", datetime(2026, 1, 1))


def test_a_role_the_scheduler_refuses_is_permission_denied(scheduler: Scheduler, tmp_path: Path) -> None:
    gateway = issue_certs("gateway", tmp_path / "gateway")
    with Client(scheduler.address, gateway) as fleet, pytest.raises(PermissionDenied):
        fleet.get_workspace("anything")


def test_the_server_must_prove_its_deployments_scheduler_name(
    scheduler: Scheduler, backend_certs: Path
) -> None:
    # The same CA, but the client expects another deployment's scheduler: the TLS name check
    # fails, and nothing is sent.
    with Client(scheduler.address, backend_certs, deployment="elsewhere", timeout=30) as fleet:
        with pytest.raises(Unavailable) as refused:
            fleet.get_workspace("anything")
        assert "Hostname Verification" in refused.value.message


def test_a_watch_survives_a_scheduler_restart(scheduler: Scheduler, backend_certs: Path) -> None:
    with Client(scheduler.address, backend_certs) as fleet:
        fleet.create_workspace("studio-1", "studio")
        job = fleet.submit_job("studio-1", "clip")
        watcher = watch_in_thread(fleet, job.job_id)
        seen, failed = watcher.seen, watcher.failed
        wait_until(lambda: bool(seen), "the first event")
        before = len(seen)

        # A graceful stop: the scheduler lets the stream run out its grace, then ends it.
        scheduler.stop()
        scheduler.start_again()
        fleet.cancel_job(job.job_id)
        watcher.join(60)

        assert not watcher.is_alive() and not failed, failed
        sequences = [e.sequence for e in seen]
        # Resumed after the last event given: strictly increasing, so none given twice.
        assert sequences == sorted(set(sequences)) and sequences[0] > 0, "an event was given twice"
        assert len(seen) > before and seen[-1].state == job_pb2.JOB_STATE_CANCELLED
        # Exactly the job's history, as a watch opened now (after the end) tells it.
        assert [e.sequence for e in fleet.watch_job(job.job_id)] == sequences


def wait_until(done: object, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"no {what} within {timeout}s"
        time.sleep(0.05)
