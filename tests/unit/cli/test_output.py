"""Tables that fit the terminal, and --json a script can read without conversions."""

from __future__ import annotations

import json

import pytest

from gpufleet.cli import output
from gpufleet.cli.output import Col, table
from gpufleet.v1 import job_pb2

HEADERS = ["JOB", Col("WORKSPACE", flexible=True), "STATE", Col("MESSAGE", flexible=True, min_width=12)]
ROWS = [
    ["8da88807", "acme-studio", "QUEUED", "workspace acme-studio is paused: its queued jobs wait"],
    ["1234abcd", "indie-creator-with-a-long-name", "SUCCEEDED", "-"],
]


def test_without_a_limit_nothing_is_cut() -> None:
    lines = table(HEADERS, ROWS, width=None).splitlines()
    assert lines[0].split() == ["JOB", "WORKSPACE", "STATE", "MESSAGE"]
    assert lines[1].endswith("workspace acme-studio is paused: its queued jobs wait")
    assert "indie-creator-with-a-long-name" in lines[2]


@pytest.mark.parametrize("width", [100, 80, 60, 50])
def test_a_narrow_terminal_cuts_the_flexible_columns_and_keeps_every_column(width: int) -> None:
    lines = table(HEADERS, ROWS, width=width).splitlines()
    assert all(len(line) <= width for line in lines), lines
    assert lines[0].split() == ["JOB", "WORKSPACE", "STATE", "MESSAGE"]
    # Ids and states are never cut.
    assert lines[1].startswith("8da88807") and "QUEUED" in lines[1] and "SUCCEEDED" in lines[2]
    assert "…" in lines[1] + lines[2]


def test_past_the_flexible_columns_minimum_the_table_stays_whole() -> None:
    lines = table(HEADERS, ROWS, width=10).splitlines()
    assert "8da88807" in lines[1] and "SUCCEEDED" in lines[2]
    assert len(lines[1].split("  ")[0]) == 8


def test_columns_env_sets_the_width_of_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "50")
    assert max(len(line) for line in table(HEADERS, ROWS).splitlines()) <= 50
    monkeypatch.delenv("COLUMNS")
    # Under pytest stdout is no terminal: a pipe gets every character.
    assert "indie-creator-with-a-long-name" in table(HEADERS, ROWS)


def test_json_numbers_are_numbers_and_every_field_is_there() -> None:
    job = job_pb2.Job(
        job_id="j",
        charge_micros=2**53,
        attempts=[job_pb2.Attempt(attempt_id="a", charge_micros=7, charged=True)],
    )
    out = json.loads(json.dumps(output.to_dict(job)))
    assert out["charge_micros"] == 2**53 and isinstance(out["charge_micros"], int)
    assert out["attempts"][0]["charge_micros"] == 7
    # Zero values are present, not left out: a script reads them without .get().
    assert out["attempt_count"] == 0 and out["slot_seconds"] == 0.0 and out["status_message"] == ""
    assert out["state"] == "JOB_STATE_UNSPECIFIED"


def test_optional_columns_go_when_cutting_is_not_enough() -> None:
    headers = ["ID", Col("NAME", flexible=True), Col("CREATED", optional=True), Col("CHARGE", optional=True)]
    rows = [["8da88807", "a long workspace name", "3m ago", "$0.0072"]]
    assert table(headers, rows, width=None).split() == [
        "ID",
        "NAME",
        "CREATED",
        "CHARGE",
        "8da88807",
        "a",
        "long",
        "workspace",
        "name",
        "3m",
        "ago",
        "$0.0072",
    ]
    narrow = table(headers, rows, width=30).splitlines()
    assert narrow[0].split() == ["ID", "NAME", "CREATED"] and all(len(line) <= 30 for line in narrow)
    assert table(headers, rows, width=20).splitlines()[0].split() == ["ID", "NAME"]
