"""More processes serving the scheduler's API on one port (``GPUFLEET_API_PROCESSES``).

Why: Python runs one thread's bytecode at a time. Profiled here, one scheduler process
spends about 1.3 ms of CPU on a SubmitJob — gRPC's asyncio core about a third of it,
tracing about a sixth, the statement and its driver about a fifth — so one process tops
out near 750 jobs/s however many threads it has. The API is stateless over the store
(every answer is read from the database; WatchJob streams are fed by one hub query per
process), so more processes can serve it: each binds the same port with
``SO_REUSEPORT`` and the kernel spreads new connections across them. This is how gRPC's
own Python examples scale a server past the GIL.

The first process (the one ``gpufleet up`` or an orchestrator starts) keeps everything
else to itself: the leader lease, the fleet tick, the catalogue sync, the port file. It
starts the others as ``python -m gpufleet.scheduler --api-only`` with the same settings
and the bound port, announces its port only once every one of them serves (so the first
clients are spread too), restarts one that dies, and stops them when it stops; each dies
with it (``PR_SET_PDEATHSIG``). One connection stays on one process: a client that wants
more than one process's worth of throughput opens more than one channel.

PostgreSQL only: SQLite has one writer at a time, and its writers queue best on the lock
of a single process (see :mod:`gpufleet.common.db.engine`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

API_ONLY_FLAG = "--api-only"
PARENT_ENV = "GPUFLEET_API_PARENT_PID"
_PR_SET_PDEATHSIG = 1


class ApiProcesses:
    """The extra API processes of one scheduler: started, watched, restarted, stopped."""

    def __init__(self, extra: int, host: str, port: int, *, start_timeout_s: float = 60.0) -> None:
        self.extra = extra
        self.address = f"{host}:{port}"
        self.start_timeout_s = start_timeout_s
        self._dir = Path(tempfile.mkdtemp(prefix="gpufleet-api-"))
        self._children: list[subprocess.Popen[bytes] | None] = [None] * extra
        self._restarts = [0] * extra
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        """Start every extra process and wait until each serves on the shared port."""
        for index in range(self.extra):
            self._children[index] = self._spawn(index)
        deadline = time.monotonic() + self.start_timeout_s
        for index in range(self.extra):
            while not self._port_file(index).exists():
                child = self._children[index]
                if child is not None and child.poll() is not None:
                    self.close()
                    raise RuntimeError(
                        f"API process {index + 1} exited with status {child.returncode} before serving"
                    )
                if time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(
                        f"API process {index + 1} did not serve within {self.start_timeout_s:.0f}s"
                    )
                time.sleep(0.05)
        log.info(
            "%d more API processes serve on %s",
            self.extra,
            self.address,
            extra={"fields": {"api_processes": self.extra + 1}},
        )
        self._watcher = threading.Thread(target=self._watch, name="api-processes", daemon=True)
        self._watcher.start()

    def _port_file(self, index: int) -> Path:
        return self._dir / f"api-{index + 1}.port"

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        self._port_file(index).unlink(missing_ok=True)
        env = dict(os.environ)
        name = env.get("GPUFLEET_INSTANCE_NAME", os.uname().nodename)
        env.update(
            {
                "GPUFLEET_LISTEN_ADDRESS": self.address,
                "GPUFLEET_PORT_FILE": str(self._port_file(index)),
                "GPUFLEET_API_PROCESSES": "1",
                "GPUFLEET_INSTANCE_NAME": f"{name}-api{index + 1}",
                PARENT_ENV: str(os.getpid()),
            }
        )
        # Its output is this process's: one log stream for the whole scheduler.
        return subprocess.Popen([sys.executable, "-m", "gpufleet.scheduler", API_ONLY_FLAG], env=env)

    def _watch(self) -> None:
        """Restart a process that died, backing off when one keeps dying."""
        while not self._stopping.wait(1.0):
            for index, child in enumerate(self._children):
                if child is None or child.poll() is None:
                    continue
                self._restarts[index] += 1
                backoff = min(30.0, 0.5 * 2 ** min(self._restarts[index], 6))
                log.warning(
                    "API process %d exited with status %s; restarting in %.1fs",
                    index + 1,
                    child.returncode,
                    backoff,
                    extra={"fields": {"api_process": index + 1, "status": child.returncode}},
                )
                if self._stopping.wait(backoff):
                    return
                self._children[index] = self._spawn(index)

    def close(self, grace: float = 5.0) -> None:
        """SIGTERM every process, wait ``grace`` (+5 s) for them, then SIGKILL."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
        live = [c for c in self._children if c is not None and c.poll() is None]
        for child in live:
            child.send_signal(signal.SIGTERM)
        until = time.monotonic() + grace + 5
        for child in live:
            try:
                child.wait(timeout=max(0.1, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("API process %d did not stop; killing it", child.pid)
                child.kill()
                child.wait(timeout=5)
        shutil.rmtree(self._dir, ignore_errors=True)


def die_with_parent() -> bool:
    """In an API-only process: ask the kernel for SIGTERM when the scheduler that started it
    dies; False when it is already gone (nothing to serve for)."""
    expected = os.environ.get(PARENT_ENV)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        log.warning("could not ask to die with the scheduler (prctl unavailable)")
    return expected is None or str(os.getppid()) == expected
