"""``gpufleet simulate --sweep``: a setting swept over values runs one month each under the
real nets, through the command, and a setting or value a month cannot run with is refused
before anything runs, naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpufleet.reaper.settings import Settings as ReaperSettings
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.sim import world
from gpufleet.sim.nets import READ_BY_SIMULATOR, NetSettings, SettingRefused, validated
from gpufleet.sim.profile import PROFILES, SimConfig
from gpufleet.sim.world import Sim
from gpufleet.sweeper.settings import Settings as SweeperSettings


def _simulate(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.cli.main", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_a_longer_went_silent_threshold_catches_dead_workers_later(tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    done = _simulate(
        *("--days", "1", "--machines", "40", "--seed", "2", "--profile", "harsh"),
        *("--sweep", "went_silent_after_s=300,1800", "--json", "--plot", str(plots)),
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["sweep"] == "went_silent_after_s"
    short, long = out["values"]["300"], out["values"]["1800"]
    for row in (short, long):
        assert row["healthy_destroys"] == 0
        assert row["jobs_lost"] == 0
        assert row["missed_or_late_detections"] == 0
    # A dead worker is caught by went silent or, first, by the money chain: at 300 s went
    # silent is first (its limit: threshold + a heartbeat + its cadence); at 1800 s the
    # money chain is, later.
    dies_short, dies_long = (
        short["detection_latency"]["worker_dies"],
        long["detection_latency"]["worker_dies"],
    )
    assert dies_short["max_s"] <= 300 + 10 + 60
    assert dies_long["p50_s"] > dies_short["p50_s"]
    assert dies_long["p95_s"] >= dies_short["p95_s"]
    assert (plots / "sweep_went_silent_after_s.png").stat().st_size > 10_000


def test_the_sweep_prints_one_table_with_a_column_a_value() -> None:
    done = _simulate(
        *("--days", "0.5", "--machines", "20", "--seed", "2"),
        *("--sweep", "idle_stop_after_s=300,600,1200"),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.startswith("idle_stop_after_s ="))
    assert header.split()[-3:] == ["300", "600", "1200"]
    for label in ("idle GPU-hours", "healthy machines destroyed", "jobs lost", "detection latency p50/p95"):
        assert any(line.startswith(label) for line in lines), label


@pytest.mark.parametrize(
    ("sweep", "needle"),
    [
        ("listen_address=1,2", "listen_address: not a setting the simulator reads"),
        ("incident_webhook_attempts=2,3", "incident_webhook_attempts: not a setting the simulator reads"),
        ("went_silent_after_s=120,900", "went_silent_after_s=120: the reaper's validation changes it to 300"),
        ("lost_after_s=-5", "lost_after_s=-5: lost_after_s: Input should be greater than 0"),
        ("idle_stop_after_s=300,9000", "idle_stop_after_s=9000: idle_destroy_after_s must be longer than"),
        ("dispatch_deadline_s=80", "dispatch_deadline_s=80"),
        ("orphan_grace_s=abc", "orphan_grace_s=abc: orphan_grace_s: Input should be a valid number"),
        ("went_silent_after_s=", "expected NAME=V1,V2"),
        ("went_silent_after_s=600,600", "each value once"),
    ],
)
def test_a_setting_or_value_a_month_cannot_run_with_is_refused_before_anything_runs(
    sweep: str, needle: str, tmp_path: Path
) -> None:
    done = _simulate(
        "--days", "30", "--machines", "500", "--sweep", sweep, "--plot", str(tmp_path / "p"), timeout=30
    )
    assert done.returncode == 2
    assert needle in done.stderr, done.stderr
    assert not (tmp_path / "p").exists()  # nothing ran


def test_a_swept_value_reaches_every_service_that_has_the_setting_and_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUFLEET_WENT_SILENT_GRACE_S", "1234")
    monkeypatch.setenv("GPUFLEET_ORPHAN_GRACE_S", "99")
    s = validated("lost_retry_backoff_s", "75")
    assert s.reaper.lost_retry_backoff_s == 75.0  # the outcome policy's
    assert s.scheduler.lost_retry_backoff_s == 75.0  # the job writers'
    # The rest are the defaults, whatever the shell says: a month reproduces anywhere.
    assert s.reaper.went_silent_grace_s == ReaperSettings.model_fields["went_silent_grace_s"].default
    assert s.sweeper.orphan_grace_s == SweeperSettings.model_fields["orphan_grace_s"].default
    sim = Sim(SimConfig(days=0.01, machines=5), settings=s)
    assert {o.lost_retry_backoff_s for o in sim.outcomes.values()} == {75.0}  # every writer's
    assert sim.retries.lost_retry_backoff_s == 75.0
    with pytest.raises(SettingRefused, match="went_silent_after_s=10"):
        validated("went_silent_after_s", "10")


# Read only on events a short month may not meet (a failed start, an agent StartJob cannot
# reach); each is checked in world.py's source instead.
_ON_RARE_EVENTS = {
    "scheduler": {"start_backoff_s", "dispatch_deadline_s", "dispatch_backoff_s", "dispatch_backoff_max_s"}
}


def test_the_sweepable_settings_are_exactly_those_the_simulator_reads() -> None:
    seen: dict[str, set[str]] = {}

    def recording(cls: type[Any], service: str) -> Any:
        fields = set(cls.model_fields)
        got = seen.setdefault(service, set())

        class Recording(cls):  # type: ignore[misc,valid-type]
            def __getattribute__(self, name: str) -> Any:
                if name in fields:
                    got.add(name)
                return super().__getattribute__(name)

        return Recording.model_construct()

    settings = NetSettings(
        reaper=recording(ReaperSettings, "reaper"),
        sweeper=recording(SweeperSettings, "sweeper"),
        scheduler=recording(SchedulerSettings, "scheduler"),
    )
    Sim(SimConfig(days=1, machines=40, seed=3, faults=PROFILES["harsh"]), settings=settings).run()
    source = Path(world.__file__).read_text()
    for service, declared in READ_BY_SIMULATOR.items():
        # The orphan policy's deployment is replaced by the simulated deployment's own.
        read = seen[service] - {"deployment_id"}
        assert read <= declared, f"{service}: read and not sweepable: {sorted(read - declared)}"
        rare = _ON_RARE_EVENTS.get(service, set())
        assert declared - rare <= read, (
            f"{service}: sweepable and never read: {sorted(declared - rare - read)}"
        )
        for name in rare:
            assert f"self.scheduler.{name}" in source, name
