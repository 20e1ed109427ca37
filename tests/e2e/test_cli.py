"""The `gpufleet` command as an operator and a newcomer use it: against a running system,
and the demo from start to finish."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

from gpufleet.cli import local_machines
from tests.e2e.fleet import Fleet
from tests.e2e.prometheus_stack import read_until_ready
from tests.support import tls
from tests.support.ports import free_block

GPUFLEET = [sys.executable, "-m", "gpufleet.cli"]


def cli(fleet: Fleet, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "GPUFLEET_SCHEDULER_ADDRESS": f"127.0.0.1:{fleet.scheduler_port}",
        "GPUFLEET_REAPER_ADDRESS": fleet.procs["reaper"].address,
        "GPUFLEET_SWEEPER_ADDRESS": fleet.procs["sweeper"].address,
        # The operator's certificate, as a deployment's environment names it.
        **{k: v for k, v in tls.env("operator").items() if k.startswith("GPUFLEET_TLS_")},
    }
    return subprocess.run([*GPUFLEET, *args], env=env, capture_output=True, text=True, timeout=60)


def test_submit_jobs_machines_and_operator_views_with_json(fleet: Fleet) -> None:
    fleet.start_all()
    out = cli(
        fleet,
        "submit",
        "--workspace",
        "indie-creator",
        "--kind",
        "clip",
        "--set",
        "duration_s=30",
        "--set",
        "topic=$(touch /tmp/pwned); echo hi",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["state"] == "JOB_STATE_QUEUED"
    assert job["tenant_values"]["topic"] == "$(touch /tmp/pwned); echo hi"

    fleet.advance_until(
        lambda: json.loads(cli(fleet, "jobs", "--json").stdout)[0]["state"] == "JOB_STATE_SUCCEEDED",
        step_s=3,
        max_virtual_s=600,
        real_pause_s=0.1,
        what="the CLI shows the job succeeded",
    )
    table = cli(fleet, "jobs")
    assert table.returncode == 0 and job["job_id"][:8] in table.stdout and "SUCCEEDED" in table.stdout
    # One job with its attempts, named by a prefix of its id.
    one = cli(fleet, "jobs", job["job_id"][:8])
    assert one.returncode == 0, one.stderr
    assert job["job_id"] in one.stdout and "FROM CHECKPOINT" in one.stdout and "SUCCEEDED" in one.stdout
    assert cli(fleet, "jobs", "no-such-prefix").returncode == 1

    machines = json.loads(cli(fleet, "machines", "--json").stdout)
    assert len(machines) == 1 and machines[0]["liveness"]["worker_report_at"]
    # Its worker's first report moved it to READY, and the record says so.
    assert (machines[0]["state_changed_by"], machines[0]["state_reason"]) == (
        "worker",
        "the worker reported in",
    )
    listing = cli(fleet, "machines").stdout
    assert "READY" in listing and "BY" in listing.splitlines()[0] and "worker" in listing
    detail = cli(fleet, "machines", machines[0]["machine_id"][:8])
    assert detail.returncode == 0, detail.stderr
    assert "by worker: the worker reported in" in detail.stdout and machines[0]["machine_id"] in detail.stdout
    assert cli(fleet, "machines", "no-such-prefix").returncode == 1

    watchdogs = json.loads(cli(fleet, "watchdogs", "--json").stdout)
    assert {"idle_scanner", "auto_stop", "auto_destroy"} <= {w["watchdog_id"] for w in watchdogs}
    request_level = {
        "queue_wait_timeout",
        "no_consumer",
        "stuck_dispatch_reset",
        "paid_wait_incident",
        "pool_idle_release",
    }
    assert request_level <= {w["watchdog_id"] for w in watchdogs}

    # The backend's view: workspaces, and a usage read that agrees with the job's charge.
    spaces = json.loads(cli(fleet, "workspaces", "--json").stdout)
    assert {"acme-studio", "indie-creator"} <= {w["workspace_id"] for w in spaces}
    assert "indie-creator" in cli(fleet, "workspaces").stdout
    charged = int(json.loads(cli(fleet, "jobs", "--json").stdout)[0]["charge_micros"])
    used = cli(fleet, "usage", "--workspace", "indie-creator", "--since", "1d", "--json")
    assert used.returncode == 0, used.stderr
    report = json.loads(used.stdout)
    assert int(report["total"]["charge_micros"]) == charged > 0
    assert [k["kind"] for k in report["by_kind"]] == ["clip"]
    table = cli(fleet, "usage", "--workspace", "indie-creator", "--since", "1d").stdout
    assert "clip" in table and "total" in table and "GPU-HOURS" in table
    assert json.loads(cli(fleet, "ledger", "--json").stdout) == []
    assert cli(fleet, "incidents").returncode == 0
    assert not Path("/tmp/pwned").exists()


def test_bad_input_and_no_system_give_one_clear_line(fleet: Fleet) -> None:
    fleet.start_all()
    bad = cli(fleet, "submit", "--workspace", "nobody")
    assert bad.returncode == 1
    assert "job.workspace" in bad.stderr and "Traceback" not in bad.stderr
    since = cli(fleet, "usage", "--workspace", "acme-studio", "--since", "last tuesday")
    assert since.returncode != 0 and "--since" in since.stderr and "Traceback" not in since.stderr
    nobody = cli(fleet, "usage", "--workspace", "nobody", "--since", "1d")
    assert nobody.returncode == 1 and "workspace_id" in nobody.stderr
    down = subprocess.run(
        [*GPUFLEET, "jobs", "--scheduler", "127.0.0.1:9"], capture_output=True, text=True, timeout=60
    )
    assert down.returncode == 1 and "gpufleet up" in down.stderr and "Traceback" not in down.stderr


def test_the_demo_tells_the_whole_story_and_exits_zero(tmp_path: Path) -> None:
    out = subprocess.run(
        [*GPUFLEET, "demo", "--state-dir", str(tmp_path / "demo"), "--speed", "180"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    for line in (
        "requested from offering",
        "worker reporting — ready for jobs",
        ": running",
        ": succeeded",
        "idle timers armed",
        "stopped: no GPU bill, disk kept",
        "destroyed: nothing left to bill",
        "a film arrives",
        "draining for film",
        "runs here alone",
        "Summary",
        "acme-studio",
        "indie-creator",
        "WAITED (DEMO MIN)",
    ):
        assert line in text, f"demo output lacks {line!r}:\n{text}"
    # The film ran on the drained machine, and the summary says so.
    assert text.index("draining for film") < text.index("runs here alone")
    assert "drained for it from" in text[text.index("Summary") :]
    assert (
        text.index("succeeded") < text.index("stopped: no GPU bill") < text.index("destroyed: nothing left")
    )
    assert not list((tmp_path / "demo" / "machines").glob("*/disk/agent.pid")), "no machine left running"


def test_up_serves_until_interrupted(tmp_path: Path) -> None:
    import signal
    import time

    # Four free consecutive ports for gRPC (`--port-offset` shifts 50051-50054) and four for
    # the metrics listeners (`--metrics-port-offset` shifts 9451-9454).
    base = free_block(4)
    metrics_base = free_block(4, exclude=range(base, base + 4))
    offset = base - 50051
    proc = subprocess.Popen(
        # A newcomer: no --state-dir (./var), and later commands from the same folder need no flag.
        [*GPUFLEET, "up", "--port-offset", str(offset), "--metrics-port-offset", str(metrics_base - 9451)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        read_until_ready(proc)
        out = subprocess.run(
            [*GPUFLEET, "submit", "--workspace", "acme-studio"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0 and "submitted job" in out.stdout, out.stderr
        # Every other command too, from the same folder, with no address or certificate flag:
        # the operator's commands reach the offset reaper and sweeper as well.
        for command in (["jobs"], ["machines"], ["workspaces"], ["watchdogs"], ["ledger"], ["orphans"]):
            ran = subprocess.run(
                [*GPUFLEET, *command], cwd=tmp_path, capture_output=True, text=True, timeout=60
            )
            assert ran.returncode == 0, (command, ran.stderr)
            assert "127.0.0.1:5005" not in ran.stderr, (command, ran.stderr)  # no default port tried
        assert (tmp_path / "var" / "gpufleet.sqlite").exists()
        # Mutual TLS with no set-up: the CA and every part's certificate were made in the state dir.
        assert (tmp_path / "var" / "tls" / "ca.crt").exists() and (
            tmp_path / "var" / "tls" / "operator.crt"
        ).exists()
        # The job's machine is started (a local machine: an agent's process session).
        deadline = time.monotonic() + 90
        while not list((tmp_path / "var" / "machines").glob("*/disk/agent.pid")):
            assert time.monotonic() < deadline, "no local machine was started for the job"
            time.sleep(0.5)
        refused = subprocess.run(
            [
                *GPUFLEET,
                "jobs",
                "--scheduler",
                f"127.0.0.1:{50051 + offset}",
                "--state-dir",
                str(tmp_path / "none"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 1 and "no operator certificate" in refused.stderr
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, rest
    assert "stopping the control plane and its local machines" in rest
    # Ctrl-C stops the local machines it started too (the job's machine), as `gpufleet down` does.
    machines = list((tmp_path / "var" / "machines").glob("*/disk/agent.pid"))
    left = local_machines.running(tmp_path / "var")
    for session in left.values():  # only if the test fails: leave nothing running on the host
        with contextlib.suppress(ProcessLookupError):
            os.killpg(session, signal.SIGKILL)
    assert machines and left == {}, rest
    assert "local machine(s) ended" in rest
