"""SubmitJob's shape checks from a table: every violation of a request is found in one
pass, and a left-out pool or pipeline version comes from the kind's catalogue entry."""

from __future__ import annotations

import pytest

from gpufleet.common.errors import InvalidArgument, Violation
from gpufleet.scheduler import validation
from gpufleet.v1 import job_pb2

GOOD = {"workspace": "acme-studio", "pool": "l4", "kind": "clip", "pipeline_version": "2026.12.0"}


def job(**overrides: object) -> job_pb2.Job:
    return job_pb2.Job(**{**GOOD, **overrides})  # type: ignore[arg-type]


def fields(found: validation.Violations) -> list[tuple[str, str]]:
    return [(v.field, v.reason) for v in found.found]


@pytest.mark.parametrize(
    ("request_id", "spec", "expected"),
    [
        ("r-1", job(), []),
        # Pool and pipeline version may be left out: the kind fills them in.
        ("r-1", job(pool="", pipeline_version=""), []),
        ("", job(), [("request_id", "REQUIRED")]),
        ("r-1", job(workspace="", kind=""), [("job.workspace", "REQUIRED"), ("job.kind", "REQUIRED")]),
        (
            "has space",
            job(workspace="Acme!", pool="L4 pool", kind="a/b", pipeline_version="1; rm -rf /"),
            [
                ("request_id", "INVALID_FORMAT"),
                ("job.workspace", "INVALID_FORMAT"),
                ("job.pool", "INVALID_FORMAT"),
                ("job.kind", "INVALID_FORMAT"),
                ("job.pipeline_version", "INVALID_FORMAT"),
            ],
        ),
        (
            "r-1",
            job(tenant_values={"ok": "v", "bad key": "v", "nul": "a\x00b", "big": "x" * 8193}),
            [
                ("job.tenant_values['bad key']", "INVALID_FORMAT"),
                ("job.tenant_values['big']", "TOO_LARGE"),
                ("job.tenant_values['nul']", "INVALID_FORMAT"),
            ],
        ),
        ("r-1", job(tenant_values={f"k{i}": "v" for i in range(65)}), [("job.tenant_values", "TOO_MANY")]),
        (
            "r-1",
            job(tenant_values={f"k{i}": "x" * 8000 for i in range(9)}),
            [("job.tenant_values", "TOO_LARGE")],
        ),
    ],
)
def test_every_violation_is_found(
    request_id: str, spec: job_pb2.Job, expected: list[tuple[str, str]]
) -> None:
    assert fields(validation.submission(request_id, spec, has_job=True)) == expected


def test_a_request_without_a_job_is_refused_at_once() -> None:
    with pytest.raises(InvalidArgument) as info:
        validation.submission("", None, has_job=False)
    assert info.value.violations == (
        Violation("request_id", "is required", "REQUIRED"),
        Violation("job", "is required", "REQUIRED"),
    )


def test_a_map_full_of_bad_keys_is_named_in_part() -> None:
    spec = job(tenant_values={f"bad key {i:02}": "v" for i in range(50)})
    found = fields(validation.submission("r-1", spec, has_job=True))
    assert len(found) == validation.MAX_ENTRY_VIOLATIONS + 1
    assert found[-1] == ("job.tenant_values", "INVALID")


def test_the_raised_error_lists_every_field_in_its_message() -> None:
    found = validation.submission("", job(workspace="", kind=""), has_job=True)
    with pytest.raises(InvalidArgument) as info:
        found.raise_if_any()
    assert info.value.message == "request_id: is required; job.workspace: is required; job.kind: is required"
    assert info.value.field == "request_id"


@pytest.mark.parametrize(
    ("spec", "defaults", "filled", "missing"),
    [
        (job(pool="", pipeline_version=""), ("l4", "7.0"), ("l4", "7.0"), []),
        (job(pool="h100", pipeline_version=""), ("l4", "7.0"), ("h100", "7.0"), []),
        (job(pool="", pipeline_version="8.1"), ("l4", None), ("l4", "8.1"), []),
        (
            job(pool="", pipeline_version=""),
            (None, None),
            ("", ""),
            [("job.pool", "REQUIRED"), ("job.pipeline_version", "REQUIRED")],
        ),
    ],
)
def test_left_out_fields_come_from_the_kind(
    spec: job_pb2.Job,
    defaults: tuple[str | None, str | None],
    filled: tuple[str, str],
    missing: list[tuple[str, str]],
) -> None:
    sent = job_pb2.Job()
    sent.CopyFrom(spec)
    found = validation.Violations()
    out = validation.with_defaults(spec, *defaults, found)
    assert (out.pool, out.pipeline_version) == filled
    assert fields(found) == missing
    assert spec == sent  # the request itself is left as sent (its content hash is of it)


def test_the_content_hash_is_of_the_request_as_sent() -> None:
    sent = job(pool="", pipeline_version="")
    assert validation.content_hash(sent) == validation.content_hash(job(pool="", pipeline_version=""))
    assert validation.content_hash(sent) != validation.content_hash(job())
