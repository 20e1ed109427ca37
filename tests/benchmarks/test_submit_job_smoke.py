"""``benchmarks/submit_job.py`` at a tiny size, in the default test run, so a schema, TLS or
API change breaks this test instead of the benchmark the day someone runs it. It asserts
that the benchmark completes, that its self-check holds (every call succeeded and every
answered job was read back from the database) and the shape of its JSON line — never its
speed (2 shared cores say nothing about the target). The self-check itself is tested
against work that was not done."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.submit_job import Figures, Stored, self_check

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--seconds", "1", "--callers", "2", "--processes", "1", "--cases", "postgresql"]


@pytest.mark.postgres
def test_the_benchmark_runs_tiny_and_its_self_check_holds() -> None:
    # A subprocess, as an operator runs it: its own PostgreSQL, its argument parsing, its exit status.
    done = subprocess.run(
        [sys.executable, "benchmarks/submit_job.py", *TINY, "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert "self-check: ok" in lines, done.stdout
    figures = json.loads(lines[-1])
    assert {"jobs_per_s", "echo_per_s", "ratio", "self_check"} <= set(figures)
    assert figures["self_check"] == "ok" and figures["problems"] == []
    assert figures["jobs_per_s"] > 0 and figures["echo_per_s"] > 0 and figures["ratio"] > 0
    assert set(figures["cases"]) == {"echo", "postgresql"}
    submitted = figures["cases"]["postgresql"]
    assert submitted["stored"] == submitted["calls"] > 0
    assert submitted["errors"] == 0


def figures(name: str, job_ids: list[str], errors: int = 0, calls: int | None = None) -> Figures:
    return Figures(
        name=name,
        calls=len(job_ids) if calls is None else calls,
        seconds=1.0,
        p50_ms=1.0,
        p99_ms=2.0,
        cpu_ms_per_call=0.5,
        pg_cpu_ms_per_call=0.2,
        errors=errors,
        first_errors=["StatusCode.UNAVAILABLE: down"] if errors else [],
        answered=job_ids,
    )


ECHO = figures("echo", [], calls=100)


def stored(job_ids: set[str], not_queued: int = 0, events: int | None = None) -> Stored:
    return Stored(frozenset(job_ids), not_queued, len(job_ids) if events is None else events)


def test_the_self_check_passes_when_every_answered_job_was_stored() -> None:
    assert self_check(ECHO, [(figures("postgresql", ["a", "b"]), stored({"a", "b"}))]) == []


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ((figures("postgresql", ["a", "b"]), stored({"a"})), "2 calls succeeded but 1 jobs were stored"),
        ((figures("postgresql", ["a", "b"]), stored({"a", "c"})), "1 answered jobs are not stored"),
        ((figures("postgresql", ["a", "a"]), stored({"a"})), "named a job another answer had named"),
        ((figures("postgresql", ["a"], errors=3), stored({"a"})), "3 calls failed"),
        ((figures("postgresql", []), stored(set())), "no call succeeded"),
        ((figures("postgresql", ["a"]), stored({"a"}, not_queued=1)), "1 stored jobs are not QUEUED"),
        ((figures("postgresql", ["a"]), stored({"a"}, events=0)), "0 first events for 1 jobs"),
    ],
    ids=[
        "rows-missing",
        "other-rows",
        "duplicate-answers",
        "failed-calls",
        "nothing",
        "not-queued",
        "no-event",
    ],
)
def test_the_self_check_fails_when_the_work_was_not_done(case: tuple[Figures, Stored], says: str) -> None:
    problems = self_check(ECHO, [case])
    assert problems, "the self-check passed work that was not done"
    assert any(says in problem for problem in problems), problems


def test_a_failed_echo_call_fails_the_self_check() -> None:
    echo = figures("echo", [], errors=1, calls=10)
    assert any("echo: 1 calls failed" in p for p in self_check(echo, []))
