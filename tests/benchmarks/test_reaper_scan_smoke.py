"""benchmarks/reaper_scan.py at a tiny size, in the default test run.

The benchmark once went unrun while the machines table grew columns, and crashed when
someone finally ran it. Running it here, at a size that takes seconds, means a schema
change breaks this test instead. It asserts that the benchmark completes and that its
self-check holds, never its speed (2 shared cores say nothing about the target).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.reaper_scan import IDLE, Expected, NetFigures, SizeRun, self_check

ROOT = Path(__file__).resolve().parents[2]
NETS = {
    "auto_stop",
    "auto_destroy",
    "provision_deadline",
    "boot_failure",
    "went_silent",
    "lost_detector",
    "stuck_transition",
    IDLE,
}


@pytest.mark.postgres
def test_the_benchmark_runs_tiny_and_its_self_check_holds() -> None:
    # A subprocess, as an operator runs it: its own PostgreSQL, its argument parsing, its exit status.
    done = subprocess.run(
        [sys.executable, "benchmarks/reaper_scan.py", "--sizes=200,2000", "--due=5", "--repeat=1", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith("self-check: ok") for line in lines), done.stdout
    figures = json.loads(lines[-1])
    assert figures["self_check"] == "ok"
    assert figures["problems"] == []
    assert figures["sizes"] == [200, 2000]
    assert figures["due"] == 5
    assert set(figures["ratio"]) == NETS | {"due_driven", "full_pass"}
    assert [run["rows"] for run in figures["runs"]] == [200, 2000]
    for run in figures["runs"]:
        assert set(run) == {"rows", "nets", "due_driven_ms", "due_driven_pg_ms", "full_pass_ms"}
        assert set(run["nets"]) == NETS
        for net, cell in run["nets"].items():
            assert set(cell) == {"scan_ms", "pg_ms", "found", "planted", "index"}
            assert cell["found"] >= cell["planted"] > 0, (run["rows"], net, cell)
        assert run["nets"][IDLE]["found"] == run["nets"][IDLE]["planted"]


def _figures(found: set[str]) -> NetFigures:
    return NetFigures(seconds=0.001, found=frozenset(found), index="ix", pg_ms=0.1)


def _run(rows: int, found: dict[str, set[str]]) -> SizeRun:
    expected = {
        "went_silent": Expected(frozenset({"m1", "m2", "m3"})),
        IDLE: Expected(frozenset({"r1", "r2"}), exact=True),
    }
    return SizeRun(rows, expected, {net: _figures(ids) for net, ids in found.items()})


def test_the_self_check_passes_when_every_scan_found_what_was_planted() -> None:
    # A due-driven net may read more than was planted for it (it refuses some), as long as
    # it reads as many at every size.
    runs = [
        _run(rows, {"went_silent": {"m1", "m2", "m3", "other"}, IDLE: {"r1", "r2"}}) for rows in (200, 2000)
    ]
    assert self_check(runs) == []


@pytest.mark.parametrize(
    ("found_at_2000", "says"),
    [
        ({"went_silent": {"m1"}, IDLE: {"r1", "r2"}}, "went_silent found 1 of the 3"),
        ({"went_silent": {"m1", "m2", "m3"}, IDLE: {"r1"}}, "idle_scanner found 1 of the 2"),
        (
            {"went_silent": {"m1", "m2", "m3"}, IDLE: {"r1", "r2", "destroyed"}},
            "idle_scanner read 1 machines",
        ),
        ({"went_silent": {"m1", "m2", "m3", "x", "y"}, IDLE: {"r1", "r2"}}, "unequal work"),
        ({IDLE: {"r1", "r2"}}, "went_silent was not measured"),
    ],
    ids=["net-missed-planted", "idle-missed-running", "idle-read-extra", "counts-differ", "net-absent"],
)
def test_the_self_check_fails_when_a_scan_did_not_do_the_work(
    found_at_2000: dict[str, set[str]], says: str
) -> None:
    runs = [_run(200, {"went_silent": {"m1", "m2", "m3"}, IDLE: {"r1", "r2"}}), _run(2000, found_at_2000)]
    problems = self_check(runs)
    assert problems, "the self-check passed work that was not done"
    assert any(says in problem for problem in problems), problems
