"""The fleet simulator (issue #9): short months on fixed seeds, with every failure class
injected (the harsh profile), the invariants checked at every step, and a planted bug
that it must notice. The month-long runs are a benchmark (benchmarks/simulate.py), not a
test."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpufleet.common.job_lifecycle import EndCause
from gpufleet.sim.profile import PROFILES, SimConfig
from gpufleet.sim.report import LIMITS, summarize
from gpufleet.sim.world import InvariantBroken, Sim

# 19, not 13: once auto-destroy took stopped machines with no destroy timer (a start the
# provider refused leaves one), seed 13's month met no pre-emption — a class rare enough in
# 3 days (a few draws a seed, most falling after the machine's life) that one seed of three
# must carry it; 19 meets every class.
SEEDS = (11, 12, 19)
DAYS, MACHINES = 3.0, 100
# Classes a 3-day month of 100 machines meets on every seed of the harsh profile; the rest
# (rarer) must be met on at least one of the seeds.
EVERY_SEED = {
    "provision_stall",
    "boot_never_completes",
    "stockout",
    "call_failed",
    "answer_lost",
    "clock_skew",
}


def month(seed: int, policy: str = "nets", plant: str | None = None) -> tuple[Sim, dict[str, Any]]:
    sim = Sim(
        SimConfig(days=DAYS, machines=MACHINES, seed=seed, faults=PROFILES["harsh"]), policy, plant=plant
    )
    sim.run()
    return sim, summarize(sim, 0.0)


@pytest.fixture(scope="module")
def nets_months() -> dict[int, dict[str, Any]]:
    return {seed: month(seed)[1] for seed in SEEDS}


def test_the_invariants_hold_and_nothing_is_lost(nets_months: dict[int, dict[str, Any]]) -> None:
    # Invariants are checked at every step (a broken one raises with its seed); what they
    # leave is counted here.
    for seed, out in nets_months.items():
        assert out["healthy_destroys"] == 0, seed
        assert out["jobs_lost"] == 0, seed
        assert out["jobs_run_twice_at_once"] == 0, seed
        assert out["violations"] == [], seed
        assert out["jobs"] > 1000 and out["jobs_ended"] > 0.9 * out["jobs"], seed


def test_every_injected_failure_is_caught_within_its_limit(nets_months: dict[int, dict[str, Any]]) -> None:
    seen: set[str] = set()
    for seed, out in nets_months.items():
        for cls, d in out["detections"].items():
            if d["injected"]:
                seen.add(cls)
            assert d["late"] == 0, (seed, cls, d)
            assert d["caught"] + d["pending_at_end"] == d["injected"], (seed, cls, d)
            if d["caught"]:
                assert d["max_latency_s"] <= d["threshold_s"] + d["cadence_s"] + 120.0 + 1e-6, (seed, cls, d)
            if cls in EVERY_SEED:
                assert d["injected"] > 0, (seed, cls)
        assert out["missed_or_late_detections"] == 0, seed
    assert seen == set(LIMITS), f"never injected: {set(LIMITS) - seen}"


def test_one_seed_reproduces_the_month_bit_for_bit() -> None:
    a = month(SEEDS[0])[1]
    b = month(SEEDS[0])[1]
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = month(SEEDS[0] + 100)[1]
    assert c["jobs"] != a["jobs"] or c["gpu_hours_billed"] != a["gpu_hours_billed"]


def test_the_real_nets_beat_a_merged_health_check_and_trail_the_oracle() -> None:
    _, nets = month(SEEDS[1])
    _, oracle = month(SEEDS[1], "oracle")
    _, merged = month(SEEDS[1], "merged")
    assert oracle["idle_gpu_hours"] <= nets["idle_gpu_hours"] < merged["idle_gpu_hours"]
    # The merged check misses what only one channel shows: a wedged worker, a boot that
    # never completes, an agent that never comes up.
    for cls in ("provision_stall", "boot_never_completes"):
        d = merged["detections"][cls]
        assert d["injected"] > 0 and d["caught"] < d["injected"], (cls, d)
    assert merged["missed_or_late_detections"] > 0


def test_a_planted_bug_in_a_net_is_caught_by_the_simulator() -> None:
    """A went-silent net that reads the freshest of the three channels (as a merged check
    would) instead of the worker's own report clock never destroys a wedged machine: the
    simulator reports the missed detection."""
    missed = 0
    for seed in SEEDS:
        try:
            _, out = month(seed, plant="went_silent_reads_composite")
        except InvariantBroken:
            missed += 1
            continue
        d = out["detections"]["worker_wedges"]
        missed += d["injected"] - d["caught"] - d["pending_at_end"] + d["late"]
    assert missed > 0


def test_the_command_prints_one_json_object_and_writes_charts(tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet.cli.main",
            "simulate",
            "--days",
            "1",
            "--machines",
            "30",
            "--seed",
            "5",
            "--json",
            "--plot",
            str(plots),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    for key in (
        "healthy_destroys",
        "jobs_lost",
        "jobs_run_twice_at_once",
        "idle_gpu_hours",
        "oracle_idle_gpu_hours",
        "merged_check_idle_gpu_hours",
        "gpu_hours_billed",
        "cost_usd",
        "detections",
        "wall_s",
        "seed",
    ):
        assert key in out, key
    assert out["seed"] == 5
    for d in out["detections"].values():
        assert {"injected", "caught", "p50_latency_s", "max_latency_s", "threshold_s", "cadence_s"} <= set(d)
    names = sorted(p.name for p in plots.iterdir())
    assert names == ["detection_latency.png", "idle_gpu_hours.png", "machines_by_state.png", "queue_wait.png"]
    assert all((plots / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--days", "0"], "--days and --machines must be positive"),
        (["--policies", "nets,bogus"], "unknown bogus"),
        (["--profile", "nope"], "invalid choice"),
    ],
)
def test_bad_arguments_are_named(args: list[str], needle: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet.sim", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert needle in done.stderr


def test_attempts_end_for_the_causes_the_services_give(nets_months: dict[int, dict[str, Any]]) -> None:
    # An expired lease is judged as the limits step judges it (lease_expiry_cause): a worker
    # that died while its agent still answered the probe is WORKER_LOST, a disruption that
    # spends none of the job's budgets — the simulator once called every one LEASE_EXPIRED.
    ends: Counter[str] = Counter()
    for out in nets_months.values():
        ends.update(out["attempt_ends"])
    assert set(ends) <= {c.value for c in EndCause}
    assert ends[EndCause.WORKER_LOST.value] > 0
    assert ends[EndCause.SUCCEEDED.value] > ends[EndCause.JOB_FAILED.value] > 0
