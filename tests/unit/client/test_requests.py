"""What the client puts in each request: a key of its own for each call that creates
something, exactly the fields given, and no naive datetimes."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from gpufleet.client import requests
from gpufleet.v1 import job_pb2

# SubmitJobRequest.request_id's rule, as the proto states it.
REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def test_each_submit_gets_its_own_valid_key() -> None:
    keys = {
        requests.submit_job(
            "ws", "clip", pool=None, pipeline_version=None, tenant_values=None, request_id=None
        ).request_id
        for _ in range(50)
    }
    assert len(keys) == 50 and all(REQUEST_ID.match(k) for k in keys)


def test_a_given_key_and_fields_are_sent_as_given() -> None:
    request = requests.submit_job(
        "ws",
        "clip",
        pool="l4",
        pipeline_version="1.2",
        tenant_values={"topic": "otters"},
        request_id="order-42",
    )
    assert request.request_id == "order-42"
    assert (request.job.workspace, request.job.kind, request.job.pool, request.job.pipeline_version) == (
        "ws",
        "clip",
        "l4",
        "1.2",
    )
    assert dict(request.job.tenant_values) == {"topic": "otters"}
    # An empty key is the caller's: sent, and the server names it.
    assert (
        requests.submit_job(
            "ws", "k", pool=None, pipeline_version=None, tenant_values=None, request_id=""
        ).request_id
        == ""
    )


def test_left_out_pool_and_version_stay_empty_for_the_kinds_defaults() -> None:
    request = requests.submit_job(
        "ws", "clip", pool=None, pipeline_version=None, tenant_values=None, request_id=None
    )
    assert (request.job.pool, request.job.pipeline_version) == ("", "")


def test_create_workspace_gets_a_key_and_cancel_does_not_need_one() -> None:
    created = requests.create_workspace("ws", "creator", paused=True, request_id=None)
    assert REQUEST_ID.match(created.request_id) and created.paused
    assert requests.cancel_job("j", reason="why", request_id=None).request_id == ""


@pytest.mark.parametrize(
    ("plan", "active", "mask"),
    [
        ("studio", None, ["plan"]),
        (None, False, ["active"]),
        ("studio", True, ["plan", "active"]),
        (None, None, []),
    ],
)
def test_update_masks_exactly_what_is_given(plan: str | None, active: bool | None, mask: list[str]) -> None:
    request = requests.update_workspace("ws", plan=plan, active=active, request_id=None)
    assert list(request.update_mask) == mask
    assert request.workspace.active is bool(active)


def test_list_filters() -> None:
    request = requests.list_jobs(
        workspace="ws", state=job_pb2.JOB_STATE_QUEUED, pool=None, page_size=3, page_token="t"
    )
    assert (request.workspace, request.state, request.pool, request.page_size, request.page_token) == (
        "ws",
        job_pb2.JOB_STATE_QUEUED,
        "",
        3,
        "t",
    )


def test_usage_times_are_aware_and_end_is_optional() -> None:
    start = datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
    request = requests.get_usage("ws", start=start, end=None)
    assert request.start_time.ToDatetime(tzinfo=UTC) == start and not request.HasField("end_time")
    with pytest.raises(ValueError, match="end: a timezone-aware datetime"):
        requests.get_usage("ws", start=start, end=datetime(2026, 1, 2))


def test_a_watch_request_carries_its_resume_point() -> None:
    assert requests.watch_job("j-1").after_sequence == 0
    resumed = requests.watch_job("j-1", after_sequence=42)
    assert (resumed.job_id, resumed.after_sequence) == ("j-1", 42)
