"""Liveness of recorded processes: zombies are dead, reused pids are not ours."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from gpufleet.agent.procs import is_alive


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)", "marker-7f3a"], env={"PROBE_MARK": "spec-91"}
    )
    yield child
    child.kill()
    child.wait()


def test_a_running_process_with_its_markers_is_alive(sleeper: subprocess.Popen[bytes]) -> None:
    assert is_alive(sleeper.pid)
    assert is_alive(sleeper.pid, cmdline=("marker-7f3a",))
    assert is_alive(sleeper.pid, environ=("PROBE_MARK=spec-91",))


def test_a_process_without_the_marker_is_not_the_recorded_one(sleeper: subprocess.Popen[bytes]) -> None:
    assert not is_alive(sleeper.pid, cmdline=("marker-7f3a", "another-state-dir"))
    assert not is_alive(sleeper.pid, environ=("PROBE_MARK=spec-92",))


def test_a_zombie_is_dead(sleeper: subprocess.Popen[bytes]) -> None:
    sleeper.kill()
    deadline = time.monotonic() + 5
    while is_alive(sleeper.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not is_alive(sleeper.pid)  # exited, not yet reaped: still in the process table
    sleeper.wait()
    assert not is_alive(sleeper.pid)


@pytest.mark.parametrize("pid", [None, 0, -1, 2**22 + 1])
def test_no_pid_is_not_alive(pid: int | None) -> None:
    assert not is_alive(pid)
