"""`gpufleet down` ends a stack's local machines as their provisioner would stop them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from gpufleet.agent.platform_kills import MACHINE_RECORD
from gpufleet.cli import local_machines
from gpufleet.provisioner.drivers.local import PID_FILE, STOPPING_MARKER


def test_the_stopping_record_and_pid_file_are_named_as_the_agent_and_the_driver_name_them() -> None:
    """Three places name the record (none may import the others): kept equal here. A job
    killed by `down` is then the platform's kill, not charged to the job."""
    assert local_machines.STOPPING_MARKER == MACHINE_RECORD == STOPPING_MARKER
    assert local_machines.PID_FILE == PID_FILE


def test_every_running_machine_is_marked_then_ended(tmp_path: Path) -> None:
    disks = [tmp_path / "machines" / name / "disk" for name in ("m0", "m1", "gone")]
    procs = []
    for disk in disks[:2]:
        disk.mkdir(parents=True)
        # A machine's session: a parent ignoring SIGTERM (so the grace runs out) and its child.
        script = (
            "import pathlib, signal, subprocess, sys, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            "pathlib.Path(sys.argv[1]).write_text('ready')\n"
            "time.sleep(600)\n"
        )
        proc = subprocess.Popen([sys.executable, "-c", script, str(disk / "ready")], start_new_session=True)
        while not (disk / "ready").exists():
            assert proc.poll() is None
            time.sleep(0.05)
        procs.append(proc)
        (disk / PID_FILE).write_text(str(proc.pid))
    disks[2].mkdir(parents=True)
    (disks[2] / PID_FILE).write_text("999999999")  # a machine that is not running
    try:
        assert set(local_machines.running(tmp_path)) == set(disks[:2])
        assert local_machines.stop_all(tmp_path, grace_s=0.5) == 2
        for proc, disk in zip(procs, disks, strict=False):
            assert proc.wait(10) == -signal.SIGKILL
            assert not local_machines.members(proc.pid)
            assert (disk / STOPPING_MARKER).read_text().startswith("its stack was stopped")
        assert not (disks[2] / STOPPING_MARKER).exists()
        assert local_machines.running(tmp_path) == {}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
