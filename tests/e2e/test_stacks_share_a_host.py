"""Two `gpufleet up` stacks and a test run on one host, every job succeeding in one attempt.

Each stack starts its own local machines 0 and 1 (the same numbers, the same default
catalogue), and a test run's agent beside them runs job after job on its own slots 0
and 1 — each job wiped before and after, killing every process of its slot's users. With
host-wide names shared between stacks (before issue #24) the wipes of one killed the jobs
of the others: FAILED (exit 137), charged, retried. Here every job of both stacks ends
SUCCEEDED on its first attempt, charged once, no retry spent; and the test run's jobs too.
"""

from __future__ import annotations

import contextlib
import pwd
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.common.host_names import HostNames, local_walls_name
from gpufleet.v1 import job_pb2
from tests.e2e.prometheus_stack import Up, gpufleet_up
from tests.integration.agent.conftest import AgentLauncher, start_request
from tests.integration.agent.fake_scheduler import start_fake_scheduler
from tests.integration.agent.fake_scheduler import wait_for as wait_real

pytestmark = pytest.mark.e2e

SPEED = 20.0
JOBS = 4  # per stack: the default catalogue's two machines of two slots, all busy at once
DURATION_S = 200  # virtual seconds: 10 s of real time, while the others start and wipe
# Virtual seconds: a tick every 15 s; leases and freshness long enough that a busy machine
# on a loaded host is never taken for a lost one; no idle stop while the test runs.
ENV = {
    "GPUFLEET_TICK_S": "15",
    "GPUFLEET_ATTEMPT_LEASE_S": "900",
    "GPUFLEET_WORKER_FRESH_S": "900",
    "GPUFLEET_HEARTBEAT_S": "30",
    "GPUFLEET_IDLE_STOP_AFTER_S": "86400",
    "GPUFLEET_IDLE_DESTROY_AFTER_S": "172800",
    "GPUFLEET_IDLE_SAMPLE_WINDOW_S": "0.2",
}


def jobs_of(up: Up) -> list[dict[str, Any]]:
    return list(up.cli_json("jobs"))


def all_ended(up: Up) -> bool:
    return all(j.get("state") in ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED") for j in jobs_of(up))


def test_two_stacks_and_a_test_run_share_a_host(tmp_path: Path) -> None:
    with contextlib.ExitStack() as cleanup:
        fake, server = start_fake_scheduler()
        cleanup.callback(server.stop, 0)
        test_run = AgentLauncher(server.port, time.time())
        cleanup.callback(test_run.kill_all)
        for name in "ab":
            (tmp_path / name).mkdir()
        stacks = [cleanup.enter_context(gpufleet_up(tmp_path / name, speed=SPEED, env=ENV)) for name in "ab"]
        state = tmp_path / "test-run" / "state"
        state.mkdir(parents=True)
        aggressor = test_run.start(state, slots=2, machine_id="machine-0", walls_name=None)

        for up in stacks:
            for n in range(JOBS):
                done = up.cli(
                    "submit",
                    "--workspace",
                    "acme-studio",
                    "--request-id",
                    f"job-{n}",
                    "--set",
                    f"duration_s={DURATION_S}",
                )
                assert done.returncode == 0, done.stderr

        # Until both stacks' jobs are over, the test run runs short jobs on its slots 0 and
        # 1, each opening and closing its slot with a wipe.
        runs = 0
        deadline = time.monotonic() + 150
        while not all(all_ended(up) for up in stacks):
            assert time.monotonic() < deadline, [(jobs_of(up), up.logs_tail()) for up in stacks]
            with aggressor.client() as client:
                for slot in (0, 1):
                    client.start_job(start_request(f"test-run-{runs}-{slot}", slot=slot, duration_s=2))
            for slot in (0, 1):
                result = wait_real(
                    lambda a=f"test-run-{runs}-{slot}": fake.completion(a), what="a test-run job"
                )
                assert result.outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED, result.message  # type: ignore[attr-defined]
            runs += 1
        assert runs >= 2, "the test run's jobs did not run beside the stacks' jobs"

        # Machine 0 of each stack: users of its own, none the other's or the test run's.
        names = [HostNames(local_walls_name(up.state_dir / "machines", 0)) for up in stacks]
        users = [{n.slot_user(s) for s in (0, 1)} for n in (*names, aggressor.names)]
        assert not (users[0] & users[1]) and not (users[0] & users[2]) and not (users[1] & users[2])
        for user in set().union(*users):
            pwd.getpwnam(user)  # each agent made its own, and ran its jobs as them

        for up in stacks:
            jobs = jobs_of(up)
            assert len(jobs) == JOBS
            for job in jobs:
                summary = (job["job_id"], job.get("state"), job.get("status_message"))
                assert job.get("state") == "JOB_STATE_SUCCEEDED", summary
                assert job.get("attempt_count") == 1, summary
                assert job.get("failure_retries_used", 0) == 0 and job.get("lost_retries_used", 0) == 0, (
                    summary
                )
                assert int(job.get("charge_micros", 0)) > 0, summary  # its own run, charged once
