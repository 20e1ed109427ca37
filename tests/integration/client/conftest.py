"""A real scheduler process on a fresh PostgreSQL database, with real mutual TLS, and the
certificate folders a backend holds — written by the real `gpufleet certs issue`."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.client import Client
from gpufleet.v1 import job_pb2
from tests.e2e.fleet import Fleet, make_fleet
from tests.support import tls
from tests.support.procs import ServiceProcess, start_service


def issue_certs(role: str, out: Path) -> Path:
    """``gpufleet certs issue --role ROLE --out OUT`` against the tests' own CA."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufleet.cli",
            "certs",
            "issue",
            "--role",
            role,
            "--ca-dir",
            str(tls.authority().folder),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


@pytest.fixture(scope="session")
def backend_certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return issue_certs("backend", tmp_path_factory.mktemp("certs") / "backend")


class Scheduler:
    """One scheduler that a test may stop and start again on the same port, as a restart
    (or a crash) of the real service would."""

    def __init__(self, pg_url: str, workdir: Path) -> None:
        self.workdir = workdir
        # The provisioner address points nowhere: no test here needs a machine.
        self.env = {
            "GPUFLEET_DATABASE_URL": pg_url,
            "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:9",
            "GPUFLEET_MAX_RUNNING_MACHINES": "0",
        }
        self.starts = 0
        self.process: ServiceProcess = self._start(port=0)

    def _start(self, port: int) -> ServiceProcess:
        self.starts += 1
        return start_service("scheduler", self.workdir, self.env, port=port, tag=f"-{self.starts}")

    @property
    def address(self) -> str:
        return self.process.address

    def start_again(self) -> None:
        """A new process on the same port (the previous one must be gone)."""
        assert self.process.process.poll() is not None, "still running"
        self.process = self._start(port=self.process.port)

    def stop(self) -> None:
        self.process.stop()


@pytest.fixture
def scheduler(pg_url: str, tmp_path: Path) -> Iterator[Scheduler]:
    svc = Scheduler(pg_url, tmp_path)
    yield svc
    svc.stop()


@pytest.fixture
def system(pg_url: str) -> Iterator[Fleet]:
    """The whole system on local machines, its clock moved by the test (tests/e2e's)."""
    # A short root: Unix socket paths and log paths stay well under their limits.
    root = Path(tempfile.mkdtemp(prefix="gfclient-", dir="/tmp"))
    fleet = make_fleet(root, pg_url)
    fleet.start_all()
    yield fleet
    fleet.close()


@dataclass
class WatchThread:
    """A client's watch of one job, followed in a thread: the events so far, what it
    raised, and the thread (``join`` when the job has ended)."""

    seen: list[job_pb2.JobEvent] = field(default_factory=list)
    failed: list[BaseException] = field(default_factory=list)
    thread: threading.Thread | None = None

    def join(self, timeout_s: float) -> bool:
        """Whether the watch ended (its stream closed) within ``timeout_s``."""
        assert self.thread is not None
        self.thread.join(timeout_s)
        return not self.thread.is_alive()

    def is_alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


def watch_in_thread(fleet: Client, job_id: str) -> WatchThread:
    """Start following ``job_id`` with ``fleet.watch_job`` in a daemon thread."""
    watch = WatchThread()

    def follow() -> None:
        try:
            watch.seen.extend(fleet.watch_job(job_id))
        except BaseException as exc:
            watch.failed.append(exc)

    watch.thread = threading.Thread(target=follow, daemon=True)
    watch.thread.start()
    return watch
