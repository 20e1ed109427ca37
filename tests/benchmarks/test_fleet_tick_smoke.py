"""``benchmarks/fleet_tick.py`` at a tiny size, so a schema, TLS or settings change can never
silently break it: it must complete with its self-checks clean — every assignment started
on the agent, no INFRA_ERROR, no machine backed off, the jobs that fit started while slow
creates were pending — and fail when its agent refuses every job. Its speed is not checked
here (the machines are shared and noisy); the figures are the benchmark's to print."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--queued", "400", "--machines", "100", "--growth", "200:50", "--steady", "2", "--create-s", "10"]


def run(*extra: str) -> tuple[int, str, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fleet_tick.py"), *TINY, "--json", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = done.stdout.strip().splitlines()
    assert lines, done.stderr[-3000:]
    return done.returncode, done.stdout, json.loads(lines[-1])


def test_the_tick_benchmark_completes_and_its_self_checks_hold() -> None:
    code, out, figures = run()
    assert code == 0, out[-3000:]
    assert "self-check: ok" in out
    assert figures["self_check"] == "ok" and figures["problems"] == []
    assert figures["jobs_started"] == figures["assignments"] == 300
    assert figures["infra_errors"] == 0 and figures["machines_backed_off"] == 0
    assert figures["jobs_started_while_creates_pending"] == 20
    assert figures["creates_pending"] == 20
    for key in ("jobs_started_per_s", "snapshot_p95_s", "tick_p95_s", "last_started_while_creates_pending_s"):
        assert figures[key] > 0, key
    assert [(g["queued"], g["machines"]) for g in figures["growth"]] == [(200, 50), (400, 100)]


def test_an_agent_that_refuses_every_job_fails_the_benchmark() -> None:
    code, out, figures = run("--broken-agent")
    assert code == 1, out[-3000:]
    assert "self-check: FAILED" in out
    assert figures["self_check"] == "failed"
    assert figures["jobs_started"] == 0 and figures["infra_errors"] > 0
    assert figures["machines_backed_off"] > 0
