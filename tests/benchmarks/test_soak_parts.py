"""The soak's own instruments, on real processes and real sockets: the process-table sampler
sees two attempts of one job alive at once (so ``jobs_run_twice`` cannot be blind), and a
cut probe path holds every byte until it heals."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.soak_parts.job_processes import JobProcessSampler
from benchmarks.soak_parts.probe_proxy import AGENT_PORT, PROXY_PORT, ProbeProxies


def job_process(tmp_path: Path, job_id: str, attempt_id: str) -> subprocess.Popen[bytes]:
    spec = tmp_path / f"{attempt_id}.json"
    spec.write_text(json.dumps({"job_id": job_id, "attempt_id": attempt_id}))
    env = {**os.environ, "GPUFLEET_JOB_SPEC": str(spec)}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def test_two_attempts_of_one_job_alive_together_are_caught(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    ours = {"job-a", "job-b"}
    sampler = JobProcessSampler(ours=ours.__contains__)
    processes.append(job_process(tmp_path, "job-a", "a-1"))
    processes.append(job_process(tmp_path, "job-b", "b-1"))
    processes.append(job_process(tmp_path, "someone-elses", "x-1"))
    assert sampler.sample() == {"job-a": {"a-1"}, "job-b": {"b-1"}}
    assert sampler.overlaps == []
    processes.append(job_process(tmp_path, "job-a", "a-2"))  # the retry, beside the first
    assert sampler.sample()["job-a"] == {"a-1", "a-2"}
    (overlap,) = sampler.overlaps
    assert (overlap.job_id, overlap.attempts) == ("job-a", ("a-1", "a-2"))
    processes[0].kill()
    processes[0].wait()
    assert sampler.sample()["job-a"] == {"a-2"}
    assert len(sampler.overlaps) == 1 and sampler.last_alive == {"a-2", "b-1"}


def test_a_cut_probe_path_holds_every_byte_until_it_heals(tmp_path: Path) -> None:
    agent = socket.create_server(("127.0.0.1", 0))
    disk = tmp_path / "machines" / "m-1" / "disk"
    disk.mkdir(parents=True)
    (disk / AGENT_PORT).write_text(str(agent.getsockname()[1]))

    def echo() -> None:
        while True:
            try:
                conn, _ = agent.accept()
            except OSError:
                return
            threading.Thread(
                target=lambda c=conn: [c.sendall(d) for d in iter(lambda: c.recv(100), b"")]
            ).start()

    threading.Thread(target=echo, daemon=True).start()
    proxies = ProbeProxies(tmp_path / "machines")
    proxies.start()
    deadline = time.monotonic() + 10
    while not (disk / PROXY_PORT).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    port = int((disk / PROXY_PORT).read_text())

    def ask(timeout: float) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
            conn.sendall(b"probe")
            return conn.recv(100)

    assert ask(5.0) == b"probe"
    assert proxies.cut("m-1")
    time.sleep(0.1)
    with pytest.raises(TimeoutError):
        ask(1.0)  # accepted, never answered: as when the path drops every segment
    proxies.heal("m-1")
    time.sleep(0.1)
    assert ask(5.0) == b"probe"
    agent.close()
