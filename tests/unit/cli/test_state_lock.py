"""One `gpufleet up` per state folder and per port, refused before anything starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.cli.stack import PortsInUse, Stack, StackConfig, taken
from gpufleet.cli.state_lock import StateDirInUse, StateLock, held, holder_pid


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    first = StateLock.take(tmp_path)
    assert held(tmp_path) and holder_pid(tmp_path) == os.getpid()
    with pytest.raises(StateDirInUse, match=f"pid {os.getpid()}.*gpufleet down --state-dir"):
        StateLock.take(tmp_path)
    first.release()
    assert not held(tmp_path) and holder_pid(tmp_path) is None
    StateLock.take(tmp_path).release()


def test_a_lock_left_by_a_killed_holder_is_stale_and_taken_over(tmp_path: Path) -> None:
    code = (
        "import os, sys; from pathlib import Path; from gpufleet.cli.state_lock import StateLock; "
        "StateLock.take(Path(sys.argv[1])); os._exit(0)"  # dies holding it: no release
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    dead = holder_pid(tmp_path)
    assert dead is not None and dead != os.getpid() and not held(tmp_path)
    lock = StateLock.take(tmp_path)
    assert lock.stale_pid == dead and holder_pid(tmp_path) == os.getpid()
    lock.release()


def test_a_port_something_listens_on_is_taken(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert taken(port)
        ports = {"scheduler": port, "reaper": port + 0}
        stack = Stack(StackConfig(state_dir=tmp_path / "var", ports=ports))
        with pytest.raises(PortsInUse, match=f"{port} \\(scheduler gRPC\\)"):
            stack.claim()
        # Refused before anything was made: no database, no clock, no machines touched.
        assert sorted(p.name for p in (tmp_path / "var").iterdir()) == ["up.lock"]
        assert stack.shutdown() == 0 and not held(tmp_path / "var")
    assert not taken(port)
