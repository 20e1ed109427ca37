"""What an operator sees in Prometheus after a short, scripted day of a real `gpufleet up`:
two jobs run on a local machine, the machine goes idle and the auto-stop net stops it. The
real Prometheus scrapes the stack from the configuration `up` wrote, and PromQL over its
HTTP API shows the figures the dashboards and alerts are built on — machines by state,
GPU-hours billed and idle, the jobs' starts, waits and outcomes, the net's act and its
detection latency, one leader per timer service — and every dashboard panel's query runs
against it without error.

The stack runs on a clock 60 times faster than real time (`up --speed 60`, every process
alike), with the demo's thresholds: 5 idle minutes to a stop pass in 5 real seconds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deploy.grafana.queries import panel_queries
from gpufleet.common.metrics.catalog import (
    ATTEMPTS_LOST,
    FLEET_GPU_BILLED,
    FLEET_GPU_IDLE,
    FLEET_MACHINES,
    JOBS_FINISHED,
    JOBS_STARTED,
    LEADER_LEADING,
    REAPER_ACTIONS,
    REAPER_DETECTION_LATENCY,
    SCHEDULER_QUEUE_WAIT,
)
from tests.e2e.prometheus_stack import Up, api, gpufleet_up, prometheus_for, query, scalar, wait_for

pytestmark = pytest.mark.e2e

SPEED = 60.0
JOBS = 2
# Virtual seconds, as the demo sets them (the clock runs SPEED times faster for every
# process): a fleet tick every 15 s, leases and freshness long enough that a busy test
# machine is never taken for a lost one, a stop after 5 idle minutes and no destroy for a
# day (the machine stays STOPPED for the gauge to show it).
ENV = {
    "GPUFLEET_TICK_S": "15",
    "GPUFLEET_ATTEMPT_LEASE_S": "900",
    "GPUFLEET_WORKER_FRESH_S": "900",
    "GPUFLEET_HEARTBEAT_S": "30",
    "GPUFLEET_IDLE_STOP_AFTER_S": "300",
    "GPUFLEET_IDLE_DESTROY_AFTER_S": "86400",
    "GPUFLEET_IDLE_SAMPLE_WINDOW_S": "0.2",
    "GPUFLEET_LOCAL_AGENT_BASE_PORT": "0",
}


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    with gpufleet_up(tmp_path, speed=SPEED, env=ENV) as stack:
        yield stack


ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
# Panels that must show data after the scenario (dashboard, panel): the figures this test
# checks in PromQL, as the dashboards query them. (A rate-based panel over one event, such as
# the detection latency's quantiles, needs two scrapes across it: not asked of a 30 s day.)
MUST_SHOW = {
    ("gpufleet / Fleet & money", "Machines by state"),
    ("gpufleet / Fleet & money", "GPU-hours billed"),
    ("gpufleet / Fleet & money", "GPU-hours idle"),
    ("gpufleet / Scheduler & tenants", "Jobs started by kind"),
    ("gpufleet / Scheduler & tenants", "Queue wait by kind"),
    ("gpufleet / Scheduler & tenants", "Fleet tick: p99 per phase"),
    # Reported per plan tier (zero where no cap binds): the plan caps' gauges reach Prometheus.
    ("gpufleet / Scheduler & tenants", "Jobs held by plan caps"),
    ("gpufleet / Scheduler & tenants", "Workspaces at their plan's cap"),
    ("gpufleet / Scheduler & tenants", "GPU jobs running by plan tier"),
    ("gpufleet / Scheduler & tenants", "gRPC server latency by method"),
    ("gpufleet / Scheduler & tenants", "Database statement latency by operation"),
    ("gpufleet / Watchdogs & ledger", "Actions by net"),
    ("gpufleet / Watchdogs & ledger", "Leaders by lease"),
    ("gpufleet / Watchdogs & ledger", "Provider calls"),
}


@pytest.fixture
def prometheus(up: Up, tmp_path: Path) -> Iterator[str]:
    with prometheus_for(up, tmp_path, rules=ALERTS) as url:
        yield url


def machine_states(up: Up) -> list[str]:
    return [m.get("state", "") for m in up.cli_json("machines")]


def job_states(up: Up) -> list[str]:
    return [j.get("state", "") for j in up.cli_json("jobs")]


def test_prometheus_shows_a_days_figures(up: Up, prometheus: str) -> None:
    for _ in range(JOBS):
        done = up.cli(
            "submit", "--workspace", "acme-studio", "--kind", "short_episode", "--set", "duration_s=120"
        )
        assert done.returncode == 0, done.stderr
    wait_for(
        lambda: job_states(up) == ["JOB_STATE_SUCCEEDED"] * JOBS,
        120,
        "both jobs to succeed",
        lambda: (job_states(up), up.logs_tail()),
    )
    wait_for(
        lambda: machine_states(up) == ["MACHINE_STATE_STOPPED"],
        120,
        "the idle machine to be stopped",
        lambda: (machine_states(up), up.logs_tail()),
    )

    def value(promql: str) -> float | None:
        # Each answer is printed (`pytest -s` shows them): the proof an operator would read.
        found = scalar(prometheus, promql)
        print(f"PromQL {promql} => {found}")
        return found

    # The machines gauge follows the fleet: the stopped machine, and no other.
    machines = FLEET_MACHINES.prometheus_name
    wait_for(
        lambda: value(f'sum({machines}{{state="STOPPED"}})') == 1,
        30,
        "the machines gauge to show the stopped machine",
        lambda: query(prometheus, f"{machines} > 0"),
    )
    assert value(f"sum({machines})") == 1

    # Money: the machine billed while it booted, ran the jobs and idled; it idled for part
    # of that (booting, between the jobs' end and the stop).
    billed = value(f"sum({FLEET_GPU_BILLED.prometheus_name})")
    idle = value(f"sum({FLEET_GPU_IDLE.prometheus_name})")
    assert billed is not None and idle is not None
    assert billed > idle > 0, (billed, idle)
    # At least the 5 idle minutes before the stop were booked as idle (virtual seconds).
    assert idle >= 300 - 2 * 15, idle

    # The jobs: each started once, waited in the queue, and succeeded.
    assert value(f"sum({JOBS_STARTED.prometheus_name})") == JOBS
    assert value(f'sum({JOBS_FINISHED.prometheus_name}{{outcome="SUCCEEDED"}})') == JOBS
    assert value(f"sum({SCHEDULER_QUEUE_WAIT.prometheus_name}_count)") == JOBS
    assert value(f"sum({ATTEMPTS_LOST.prometheus_name})") in (None, 0)

    # The auto-stop net acted once, and its detection latency (from idle since to the stop)
    # is at least the idle threshold.
    # (Waited for: the machine reads STOPPED as soon as the stop is committed, and the reaper
    # counts the act then; the next scrape brings it.)
    wait_for(
        lambda: value(f'sum({REAPER_ACTIONS.prometheus_name}{{net="auto_stop"}})') == 1,
        30,
        "the auto-stop net's act to be scraped",
        lambda: query(prometheus, f"{REAPER_ACTIONS.prometheus_name} or gpufleet_reaper_refusals_total"),
    )
    latency = REAPER_DETECTION_LATENCY.prometheus_name
    assert value(f'sum({latency}_count{{net="auto_stop"}})') == 1
    stop_latency = value(f'sum({latency}_sum{{net="auto_stop"}})')
    assert stop_latency is not None and stop_latency >= 300, stop_latency

    # One leader per timer service.
    leaders = dict(
        (labels["lease"], count)
        for labels, count in query(prometheus, f"sum by (lease) ({LEADER_LEADING.prometheus_name})")
    )
    assert leaders == {"scheduler": 1, "reaper": 1, "sweeper": 1}

    # The alert rules load and evaluate on the live series without an error, and none fires
    # on this healthy day (the idle one needs hours; nothing is stuck, silent or leaderless).
    # A rule may be pending: a machine briefly STOPPING (the day's auto-stop) starts the
    # stuck-transition rule's 30-minute `for`, which is what `for` is there to absorb.
    def rules() -> list[dict[str, object]]:
        return [r for g in api(prometheus, "rules")["groups"] for r in g["rules"]]

    wait_for(
        lambda: rules() and all(r.get("lastEvaluation", "").startswith("20") for r in rules()),
        30,
        "every alert rule to be evaluated",
        rules,
    )
    assert [(r["name"], r["health"], r.get("lastError")) for r in rules() if r["health"] != "ok"] == []
    assert [r["name"] for r in rules() if r["state"] == "firing"] == []

    # Every panel's query runs against this Prometheus; the panels that show this test's
    # figures show data.
    showing: set[tuple[str, str]] = set()
    for panel in panel_queries():
        if query(prometheus, panel.promql()):
            showing.add((panel.dashboard, panel.panel))
    assert showing >= MUST_SHOW, MUST_SHOW - showing
