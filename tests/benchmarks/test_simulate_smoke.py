"""``benchmarks/simulate.py`` at a tiny size, in the default test run, so a change to the
simulator's world or the decisions it imports cannot leave the benchmark broken unseen. It
asserts that the benchmark completes and that its self-check holds — never its speed —
and that the self-check fails a run that did no work or broke a rule."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.simulate import self_check

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_runs_tiny_and_its_self_check_holds() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/simulate.py",
            "--days=0.5",
            "--machines=20,40",
            "--lengths=0.25,0.5",
            "--length-machines=20",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0] == "self-check: ok", done.stdout
    figures = json.loads(lines[-1])
    assert figures["problems"] == []
    assert [(r["days"], r["machines"]) for r in figures["by_machines"]] == [(0.5, 20), (0.5, 40)]
    assert [(r["days"], r["machines"]) for r in figures["by_days"]] == [(0.25, 20), (0.5, 20)]
    for row in figures["by_machines"] + figures["by_days"]:
        assert (
            row["attempts_succeeded"] > 0
            and row["fleet_ticks"] > 0
            and row["sim_seconds_per_wall_second"] > 0
        )
    # More fleet, more work: the ratios compare runs that did different amounts of it.
    assert figures["by_machines"][1]["jobs"] > figures["by_machines"][0]["jobs"]


def _row(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "days": 1.0,
        "machines": 20,
        "simulated_s": 86_400.0,
        "jobs": 100,
        "attempts_succeeded": 95,
        "fleet_ticks": 500,
        "machines_created": 12,
        "provider_calls": 40,
        "healthy_destroys": 0,
        "jobs_run_twice_at_once": 0,
        "calls_without_intent": 0,
    }
    return row | changes


def test_the_self_check_passes_a_month_that_did_its_work() -> None:
    assert self_check([_row(), _row(machines=40, jobs=200, attempts_succeeded=190)]) == []


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"jobs": 0, "attempts_succeeded": 0}, "jobs is 0"),
        ({"attempts_succeeded": 0}, "attempts_succeeded is 0"),
        ({"attempts_succeeded": 30}, "only 30 of 100 jobs succeeded"),
        ({"fleet_ticks": 0}, "fleet_ticks is 0"),
        ({"simulated_s": 3600.0}, "stopped at 3,600 s"),
        ({"healthy_destroys": 1}, "healthy_destroys = 1"),
        ({"jobs_run_twice_at_once": 2}, "jobs_run_twice_at_once = 2"),
        ({"calls_without_intent": 1}, "calls_without_intent = 1"),
    ],
    ids=[
        "no-jobs",
        "nothing-succeeded",
        "most-failed",
        "no-ticks",
        "stopped-early",
        "healthy-destroy",
        "run-twice",
        "no-intent",
    ],
)
def test_the_self_check_fails_a_run_that_did_not_do_the_work(changes: dict[str, Any], says: str) -> None:
    problems = self_check([_row(), _row(**changes)])
    assert problems, "the self-check passed work that was not done"
    assert any(says in p for p in problems), problems
