"""The CLI that acts (#24), against one real `gpufleet up` shared by the module: cancel,
cordon / uncordon / drain, pools, workspaces create / pause / resume / set-plan,
submit --wait and logs --follow with their exit statuses, --watch, unique prefixes and
their mistakes, --json numbers, a closed pipe, the address a failure names — and last,
`up` refused on a folder or ports in use, and `down`."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.cli import local_machines
from tests.e2e.prometheus_stack import GPUFLEET, Up, gpufleet_up, wait_for
from tests.support.ports import free_block

pytestmark = pytest.mark.e2e

SPEED = 10.0
# Virtual seconds. Leases and freshness long enough that a busy machine on a loaded host is
# never taken for a lost one; no machine stops while the module runs (a stopped machine's
# log cannot be read).
ENV = {
    "GPUFLEET_ATTEMPT_LEASE_S": "900",
    "GPUFLEET_WORKER_FRESH_S": "900",
    "GPUFLEET_IDLE_STOP_AFTER_S": "86400",
    "GPUFLEET_IDLE_DESTROY_AFTER_S": "172800",
    "GPUFLEET_IDLE_SAMPLE_WINDOW_S": "0.2",
}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with gpufleet_up(tmp_path_factory.mktemp("cli-acts"), speed=SPEED, env=ENV) as stack:
        yield stack


def args_for(up: Up, *args: str) -> list[str]:
    return [*GPUFLEET, *args, "--scheduler", up.scheduler, "--state-dir", str(up.state_dir)]


def cli(up: Up, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args_for(up, *args), capture_output=True, text=True, timeout=timeout)


def popen(up: Up, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(args_for(up, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, (done.args, done.stdout[-2000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    return done


def submit(up: Up, workspace: str, *values: str, kind: str = "clip") -> str:
    sets = [x for v in values for x in ("--set", v)]
    done = ok(cli(up, "submit", "--workspace", workspace, "--kind", kind, *sets, "--json"))
    return str(json.loads(done.stdout)["job_id"])


def job(up: Up, job_id: str) -> dict[str, Any]:
    return dict(up.cli_json("jobs", job_id))


def state(up: Up, job_id: str) -> str:
    return str(job(up, job_id)["state"]).removeprefix("JOB_STATE_")


def refused(done: subprocess.CompletedProcess[str], *says: str) -> None:
    assert done.returncode == 1, (done.args, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    for text in says:
        assert text in done.stderr, (text, done.stderr)


def test_submit_wait_exits_with_the_jobs_outcome(up: Up) -> None:
    done = ok(
        cli(up, "submit", "--workspace", "acme-studio", "--kind", "clip", "--set", "duration_s=20", "--wait")
    )
    assert "QUEUED" in done.stderr and "RUNNING" in done.stderr and "SUCCEEDED" in done.stderr
    assert "succeeded after 1 attempt(s)" in done.stdout
    failed = cli(
        up, "submit", "--workspace", "acme-studio", "--kind", "clip", "--set", "duration_s=2",
        "--set", "exit_code=7", "--wait", "--json",
    )  # fmt: skip
    assert failed.returncode == 3, failed.stderr  # FAILED, after its retry budget
    ended = json.loads(failed.stdout)
    assert ended["state"] == "JOB_STATE_FAILED" and ended["attempt_count"] == 3
    assert isinstance(ended["charge_micros"], int) and ended["charge_micros"] > 0
    # Its log, followed, ends with the attempt's outcome and the same status.
    follow = cli(up, "logs", ended["job_id"][:8], "--follow")
    assert follow.returncode == 3, follow.stderr
    assert "sample pipeline" in follow.stdout and "failed (exit 7)" in follow.stderr


def test_cancel_follow_and_prefixes(up: Up) -> None:
    """A workspace on the creator plan runs two jobs at once: the third waits, `logs
    --follow` waits with it, and starts printing once a cancel frees its place."""
    ok(cli(up, "workspaces", "create", "follow-ws", "--plan", "creator"))
    long_ones = [submit(up, "follow-ws", "duration_s=3000") for _ in range(2)]
    wait_for(lambda: all(state(up, j) == "RUNNING" for j in long_ones), 90, "two long jobs running")
    third = submit(up, "follow-ws", "duration_s=20")
    follow = popen(up, "logs", third[:8], "--follow")
    try:
        time.sleep(3)  # real time: the follower must still be waiting on a queued job
        assert follow.poll() is None and state(up, third) == "QUEUED"
        cancelled = ok(cli(up, "cancel", long_ones[0][:8], long_ones[1]))
        assert cancelled.stderr.count("cancelled") == 2
        out, err = follow.communicate(timeout=120)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 0, err
    assert "has not started yet" in err and "RUNNING" in err and "succeeded" in err
    assert "sample pipeline: done" in out
    assert [state(up, j) for j in long_ones] == ["CANCELLED", "CANCELLED"]
    # Idempotent: cancelling again answers the same; a job that ended otherwise is left alone.
    again = ok(cli(up, "cancel", *long_ones, third, "--json"))
    assert [j["state"] for j in json.loads(again.stdout)] == ["JOB_STATE_CANCELLED"] * 2 + [
        "JOB_STATE_SUCCEEDED"
    ]
    assert "already succeeded: nothing to cancel" in again.stderr
    # Every id command takes the table's 8 characters.
    assert third in ok(cli(up, "jobs", third[:8])).stdout
    assert "sample pipeline: done" in ok(cli(up, "logs", third[:8])).stdout


def test_bad_ids_and_ambiguous_prefixes_say_what_to_do(up: Up) -> None:
    # 17 ids over 16 hex digits: two share their first character.
    ids = [submit(up, "indie-creator", "duration_s=1") for _ in range(17)]
    first = collections.Counter(i[0] for i in ids).most_common(1)[0][0]
    sharing = [i for i in ids if i.startswith(first)]
    for command in (["jobs", first], ["logs", first], ["cancel", first], ["logs", first, "--follow"]):
        done = cli(up, *command)
        refused(done, f"{first!r} is the start of", "give more of the one you mean")
        for candidate in sharing:
            assert candidate in done.stderr, command
    for command in (["jobs", "zzzz"], ["logs", "zzzz"], ["cancel", "zzzz"], ["machines", "zzzz"]):
        refused(cli(up, *command), "no ", "with an id starting 'zzzz'")
    refused(cli(up, "machines", "drain", "zzzz"), "no machine with an id starting 'zzzz'")
    refused(cli(up, "cancel", "00000000-0000-4000-8000-000000000000"), "job_id")
    # One bad id among good ones: the good ones are cancelled all the same.
    mixed = cli(up, "cancel", "zzzz", *ids)
    refused(mixed, "zzzz")
    assert all(state(up, i) in ("CANCELLED", "SUCCEEDED") for i in ids)


def test_cordon_drain_and_uncordon_a_machine(up: Up) -> None:
    running = submit(up, "acme-studio", "duration_s=150")
    wait_for(lambda: state(up, running) == "RUNNING", 90, "the job running")
    machine = str(job(up, running)["attempts"][-1]["machine_id"])
    said = ok(cli(up, "machines", "cordon", machine[:8])).stdout
    assert "cordoned" in said and "running job(s) go on" in said
    assert up.cli_json("machines", machine[:8])["cordoned"] is True
    drain = popen(up, "machines", "drain", machine[:8], "--interval", "0.5")
    try:
        out, err = drain.communicate(timeout=120)
    finally:
        if drain.poll() is None:
            drain.kill()
    assert drain.returncode == 0, err
    assert "slot(s) still busy" in err and "drained" in out
    # It waited for the job to end; it did not cut it off.
    assert state(up, running) == "SUCCEEDED"
    detail = up.cli_json("machines", machine[:8])
    assert detail["cordoned"] is True and detail["slots_busy"] == 0
    assert "uncordoned" in ok(cli(up, "machines", "uncordon", machine)).stdout
    assert up.cli_json("machines", machine[:8])["cordoned"] is False
    assert "drain ID: cordon the machine" in " ".join(ok(cli(up, "machines", "--help")).stdout.split())


def test_workspaces_pause_resume_create_and_set_plan(up: Up) -> None:
    refused(cli(up, "workspaces", "create", "ws-bad", "--plan", "no-such-plan"), "workspace.plan")
    created = ok(cli(up, "workspaces", "create", "ws-cli", "--plan", "creator", "--paused", "--json"))
    assert json.loads(created.stdout)["active"] is False
    refused(cli(up, "workspaces", "create", "ws-cli", "--plan", "studio"))  # taken by another request
    refused(cli(up, "submit", "--workspace", "ws-cli", "--kind", "clip"), "job.workspace")
    ok(cli(up, "workspaces", "resume", "ws-cli"))
    ok(cli(up, "workspaces", "set-plan", "ws-cli", "studio"))
    listed = {w["workspace_id"]: w for w in up.cli_json("workspaces")}
    assert listed["ws-cli"]["active"] is True and listed["ws-cli"]["plan"] == "studio"
    paused = ok(cli(up, "workspaces", "pause", "ws-cli", "acme-studio"))
    assert paused.stdout.count("paused") == 2
    assert not any(
        w["active"] for w in up.cli_json("workspaces") if w["workspace_id"] in ("ws-cli", "acme-studio")
    )
    refused(cli(up, "workspaces", "resume", "ws-cli", "acme-studio", "nobody"), "workspace nobody")
    assert all(w["active"] for w in up.cli_json("workspaces"))
    refused(cli(up, "workspaces", "set-plan", "ws-cli"), "set-plan W PLAN")


def test_pools_kinds_plans_json_numbers_and_tables_that_fit(up: Up) -> None:
    table = ok(cli(up, "pools")).stdout
    assert table.splitlines()[0].split()[:2] == ["POOL", "GPU"] and "local-l4" in table
    (pool,) = up.cli_json("pools")
    assert pool["pool_id"] == "l4" and pool["max_machines"] == 2
    assert isinstance(pool["offerings"][0]["hourly_price_micros"], int)
    kinds = {k["kind_id"]: k for k in up.cli_json("kinds")}
    assert kinds["film"]["slots"] == 0 and kinds["clip"]["default_pool"] == "l4"
    assert isinstance(kinds["film"]["memory_limit_bytes"], int) and kinds["clip"]["default_pipeline_version"]
    listed = ok(cli(up, "kinds")).stdout
    assert "whole machine" in listed and "DEFAULT POOL" in listed.splitlines()[0]
    assert {p["plan_id"] for p in up.cli_json("plans")} >= {"studio", "creator"}
    # A job that names no pool or version gets its kind's (the CLI sends none by default).
    clip = up.cli_json("jobs", submit(up, "acme-studio", "duration_s=1"))
    assert (clip["pool"], clip["pipeline_version"]) == ("l4", kinds["clip"]["default_pipeline_version"])
    jobs = up.cli_json("jobs")
    assert all(isinstance(j["charge_micros"], int) and isinstance(j["attempt_count"], int) for j in jobs)
    narrow = subprocess.run(
        args_for(up, "jobs"), capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"}
    )
    lines = ok(narrow).stdout.splitlines()
    assert lines[0].split()[:4] == ["JOB", "WORKSPACE", "KIND", "STATE"] and all(len(x) <= 80 for x in lines)


def test_a_closed_pipe_ends_quietly(up: Up) -> None:
    reaper = f"127.0.0.1:{int(up.scheduler.rsplit(':', 1)[1]) + 1}"
    for command in (["watchdogs", "--json", "--reaper", reaper], ["jobs", "--json"], ["jobs"]):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first byte, as `| head` is after its lines
        try:
            done = subprocess.run(
                args_for(up, *command), stdout=write, stderr=subprocess.PIPE, text=True, timeout=60
            )
        finally:
            os.close(write)
        assert done.returncode == 141, (command, done.stderr)
        assert done.stderr == "", (command, done.stderr)


def test_a_failure_names_the_address_it_tried(up: Up) -> None:
    nowhere = f"127.0.0.1:{free_block(1)}"
    down = cli(up, "watchdogs", "--reaper", nowhere)
    refused(down, f"the reaper at {nowhere} did not answer", "--reaper")
    assert up.scheduler not in down.stderr
    refused(cli(up, "orphans", "--sweeper", nowhere), f"the sweeper at {nowhere}")
    no_scheduler = subprocess.run(
        [*GPUFLEET, "jobs", "--scheduler", nowhere, "--state-dir", str(up.state_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    refused(no_scheduler, f"the scheduler at {nowhere} did not answer")


def test_jobs_and_machines_watch_until_interrupted(up: Up) -> None:
    for command in (["jobs", "--watch", "--interval", "0.3"], ["machines", "--watch", "--interval", "0.3"]):
        watch = popen(up, *command)
        try:
            assert watch.stdout is not None
            frames, header = 0, ""
            deadline = time.monotonic() + 60
            while frames < 3 and time.monotonic() < deadline:
                line = watch.stdout.readline()
                frames += line.startswith("--- ")
                header = header or (line if line.startswith(("JOB", "MACHINE")) else "")
            assert frames == 3 and header, command
            watch.send_signal(signal.SIGINT)
            # Read what it still writes while it ends: a watch whose pipe nobody drains blocks
            # on its last flush (a full pipe), which is the test's doing, not the CLI's.
            watch.communicate(timeout=30)
            assert watch.returncode == 0
        finally:
            if watch.poll() is None:
                watch.kill()
    refused(cli(up, "jobs", "--watch", "--json"), "--watch")


def test_up_refuses_a_folder_or_ports_in_use_then_down_stops_everything(up: Up, tmp_path: Path) -> None:
    """Last in the module: it stops the shared stack."""
    port = int(up.scheduler.rsplit(":", 1)[1])
    metrics = up.metrics_ports["scheduler"]
    offsets = ["--port-offset", str(port - 50051), "--metrics-port-offset", str(metrics - 9451)]
    second = subprocess.run(
        [*GPUFLEET, "up", "--state-dir", str(up.state_dir), *offsets, "--speed", repr(SPEED)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert second.returncode == 1 and "ready." not in second.stdout, second.stdout + second.stderr
    assert f"{up.state_dir} is in use by another `gpufleet up` (pid" in second.stderr
    elsewhere = subprocess.run(
        [*GPUFLEET, "up", "--state-dir", str(tmp_path / "other"), *offsets],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert elsewhere.returncode == 1 and "ready." not in elsewhere.stdout
    assert f"{port} (scheduler gRPC)" in elsewhere.stderr and "already in use" in elsewhere.stderr
    assert not (tmp_path / "other" / "gpufleet.sqlite").exists()
    # The first stack is untouched by either.
    ok(cli(up, "jobs"))

    assert local_machines.running(up.state_dir), "the stack has local machines to stop"
    stopped = ok(
        subprocess.run(
            [*GPUFLEET, "down", "--state-dir", str(up.state_dir)], capture_output=True, text=True, timeout=120
        )
    )
    assert "stopped its services and local machines" in stopped.stdout
    assert local_machines.running(up.state_dir) == {}
    refused(cli(up, "jobs"), f"the scheduler at {up.scheduler} did not answer")
    assert (
        "nothing runs on"
        in ok(
            subprocess.run(
                [*GPUFLEET, "down", "--state-dir", str(up.state_dir)],
                capture_output=True,
                text=True,
                timeout=60,
            )
        ).stdout
    )
    # It ran at speed 10: real time on the same folder is refused, as README says.
    slower = subprocess.run(
        [*GPUFLEET, "up", "--state-dir", str(up.state_dir), *offsets],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        slower.returncode == 2
        and "was started with --speed 10" in slower.stderr
        and "ready." not in slower.stdout
    )
