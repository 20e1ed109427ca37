"""An orphan planted beside a running system, on real processes (local driver, shared file
clock): the sweeper finds it, keeps it through its grace window, then removes it — its
folder and its processes gone — as SweeperService.ListOrphans shows at each step, while
the machine the system recorded for itself is left alone."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from datetime import UTC, timedelta
from pathlib import Path

from sqlalchemy import select

from gpufleet.common.db import models
from gpufleet.common.trust.identity import Role
from gpufleet.provisioner.drivers.base import InstanceSpec, Offering, Provider
from gpufleet.provisioner.drivers.local import LocalDriver
from gpufleet.provisioner.drivers.local_procs import group_members
from gpufleet.v1 import job_pb2, sweeper_service_pb2, sweeper_service_pb2_grpc
from tests.e2e.fleet import Fleet

ORPHAN = "orphan-e2e-1"
# Stands in for an orphan's agent: it keeps a child of its own alive, as a real machine's
# agent keeps its worker, and leaves its pid where the fleet's cleanup looks for it.
STAND_IN = (
    "import os, pathlib, subprocess, sys, time\n"
    "pathlib.Path('disk/agent.pid').write_text(str(os.getpid()))\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)'])\n"
    "pathlib.Path('disk/child.pid').write_text(str(child.pid))\n"
    "time.sleep(3600)\n"
)


def plant_orphan(fleet: Fleet) -> tuple[Path, int]:
    """A local machine with our deployment label and no record here: created with the
    local driver itself (same root, same deployment id), not through the provisioner."""
    driver = LocalDriver(
        fleet.machines_root,
        "local",  # the deployment id every process of this fleet runs with (the default)
        fleet.clock,
        scheduler_address=fleet.env["GPUFLEET_SCHEDULER_ADDRESS"],
        agent_command=(sys.executable, "-c", STAND_IN),
        agent_wait_s=0.2,
    )
    offering = Offering(
        provider=Provider.LOCAL, region="local", zone="local-a", instance_type="local-g2-standard-8", slots=1
    )
    info = driver.create(InstanceSpec(machine_id=ORPHAN, offering=offering))
    assert info.labels["gpufleet-deployment"] == "local"
    folder = fleet.machines_root / ORPHAN
    record = json.loads((folder / "instance.json").read_text())
    return folder, int(record["pgid"])


def orphans(stub: sweeper_service_pb2_grpc.SweeperServiceStub) -> dict[str, sweeper_service_pb2.Orphan]:
    page = stub.ListOrphans(sweeper_service_pb2.ListOrphansRequest(), timeout=10)
    return {o.machine_label: o for o in page.orphans}


def test_a_planted_orphan_is_found_kept_through_its_grace_window_then_removed(fleet: Fleet) -> None:
    fleet.start_all()
    sweeper = sweeper_service_pb2_grpc.SweeperServiceStub(
        fleet.channel(fleet.procs["sweeper"].address, Role.SWEEPER)
    )
    # The running system has a machine of its own: a job puts one there.
    job = fleet.submit("beside-the-orphan", duration_s=60)
    done = fleet.advance_until(
        lambda: (j := fleet.get_job(job.job_id)).state == job_pb2.JOB_STATE_SUCCEEDED and j,
        step_s=2,
        max_virtual_s=900,
        what="job succeeded",
    )
    ours = done.attempts[0].machine_id

    folder, pgid = plant_orphan(fleet)
    try:
        assert group_members(pgid), "the orphan's processes run"
        child = _wait_for_pid(folder / "disk" / "child.pid")

        # Found by the next sweep (every 5 minutes of clock time), inside its grace window.
        seen = fleet.advance_until(
            lambda: orphans(sweeper).get(ORPHAN), step_s=20, max_virtual_s=600, what="orphan listed"
        )
        assert seen.action == "WAITING"
        assert seen.name.startswith("orphans/local/local-")
        first_seen = seen.first_seen_time.ToDatetime(tzinfo=UTC)
        assert seen.launch_time.ToDatetime(tzinfo=UTC) <= first_seen
        assert not seen.HasField("destroy_time")

        # Kept through its grace window: 25 minutes after it was first seen it still runs.
        fleet.advance_until(
            lambda: fleet.clock.now() >= first_seen + timedelta(minutes=25),
            step_s=20,
            max_virtual_s=1800,
            what="25 minutes on",
        )
        waiting = orphans(sweeper)[ORPHAN]
        assert waiting.action == "WAITING"
        assert waiting.first_seen_time == seen.first_seen_time
        assert folder.exists() and group_members(pgid)

        # Then removed: folder and processes gone, a ledger row saying why.
        gone = fleet.advance_until(
            lambda: (o := orphans(sweeper)[ORPHAN]).action == "DESTROYED" and o,
            step_s=20,
            max_virtual_s=900,
            what="orphan destroyed",
        )
        destroyed = gone.destroy_time.ToDatetime(tzinfo=UTC)
        assert destroyed >= first_seen + timedelta(minutes=30)
        assert not folder.exists()
        _reap(pgid)
        assert group_members(pgid) == []
        assert not _alive(child)
        with fleet.sessions() as s:
            found = (
                s.execute(select(models.Failure).where(models.Failure.failure_class == "orphan_found"))
                .scalars()
                .all()
            )
            machine = s.get_one(models.Machine, ours)
        assert [(f.machine_id, f.detector) for f in found] == [(ORPHAN, "orphan_sweep")]
        # The machine the system recorded is nobody's orphan: its disk is still there.
        assert machine.state != "DESTROYED"
        assert (fleet.machines_root / ours).exists()
        assert set(orphans(sweeper)) == {ORPHAN}
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, 9)
        _reap(pgid)


def _wait_for_pid(path: Path, timeout_s: float = 15.0) -> int:
    """The stand-in writes its child's pid as it starts (real time: a process starting)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            return int(path.read_text().strip())
        time.sleep(0.05)
    raise AssertionError(f"{path} was never written")


def _reap(pid: int) -> None:
    """The stand-in is this test's child: collect it once it has been ended."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
