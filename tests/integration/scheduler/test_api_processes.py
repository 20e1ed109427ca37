"""GPUFLEET_API_PROCESSES: more scheduler processes serving the API on one port.

Real processes on loopback: the first scheduler starts the others, the kernel spreads
connections across them, every process answers from the same store, one that dies is
restarted, and all of them go when the first one does — even when it is killed outright.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpufleet.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from tests.support.procs import ServiceProcess, start_service

CHANNELS = 24


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _accepted_by(pid: int, port: int) -> int:
    """Established connections to ``port`` whose accepted socket ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01" and fields[9] in inodes:  # 01: ESTABLISHED
                count += 1
    return count


def _wait(what: str, check, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def two(pg_url: str, tmp_path: Path) -> Iterator[ServiceProcess]:
    svc = start_service(
        "scheduler",
        tmp_path,
        {
            "GPUFLEET_DATABASE_URL": pg_url,
            "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:9",
            "GPUFLEET_MAX_RUNNING_MACHINES": "0",
            "GPUFLEET_API_PROCESSES": "2",
        },
    )
    yield svc
    svc.stop()


def _submit(stub: job_service_pb2_grpc.JobServiceStub, n: int) -> job_pb2.Job:
    return stub.SubmitJob(  # type: ignore[no-any-return]
        job_service_pb2.SubmitJobRequest(
            request_id=f"spread-{n}",
            job=job_pb2.Job(workspace="acme-studio", pool="l4", kind="short_episode", pipeline_version="v1"),
        ),
        timeout=10,
    )


def test_connections_spread_over_every_process_and_all_answer_from_one_store(two: ServiceProcess) -> None:
    [child] = _wait("the second API process", lambda: _children(two.process.pid))
    channels = [two.channel("backend", **{"grpc.use_local_subchannel_pool": 1}) for _ in range(CHANNELS)]
    try:
        jobs = [_submit(job_service_pb2_grpc.JobServiceStub(c), n) for n, c in enumerate(channels)]
        by_parent, by_child = _accepted_by(two.process.pid, two.port), _accepted_by(child, two.port)
        assert by_parent + by_child >= CHANNELS
        assert by_parent > 0 and by_child > 0, (by_parent, by_child)
        # Whichever process a job was submitted to, every process reads it back.
        for channel in channels:
            stub = job_service_pb2_grpc.JobServiceStub(channel)
            for job in jobs[:3]:
                assert (
                    stub.GetJob(job_service_pb2.GetJobRequest(job_id=job.job_id), timeout=10).job_id
                    == job.job_id
                )
        # The same request_id on another process answers as the first did.
        assert _submit(job_service_pb2_grpc.JobServiceStub(channels[-1]), 0).job_id == jobs[0].job_id
    finally:
        for channel in channels:
            channel.close()
    assert "api_processes" in two.log() or "more API processes serve" in two.log()


def test_a_dead_api_process_is_restarted_and_all_go_with_the_first(two: ServiceProcess) -> None:
    [child] = _wait("the second API process", lambda: _children(two.process.pid))
    os.kill(child, signal.SIGKILL)
    [again] = _wait("a restarted API process", lambda: [c for c in _children(two.process.pid) if c != child])
    _wait("a call served by the restarted process", lambda: _served_by(again, two))
    assert "restarting" in two.log()
    # Killed outright, the first process takes the others with it (PR_SET_PDEATHSIG).
    two.kill()
    _wait("the API process to go with the scheduler", lambda: not _alive(again), timeout=10)


def _served_by(pid: int, svc: ServiceProcess) -> bool:
    """A new connection, one call on it: True when ``pid`` accepted and answered it."""
    with svc.channel("backend", **{"grpc.use_local_subchannel_pool": 1}) as channel:
        try:
            job_service_pb2_grpc.JobServiceStub(channel).ListJobs(
                job_service_pb2.ListJobsRequest(), timeout=10
            )
        except grpc.RpcError:
            return False
        return _accepted_by(pid, svc.port) > 0


def test_more_api_processes_on_sqlite_are_refused_at_start(sqlite_url: str, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GPUFLEET_DATABASE_URL": sqlite_url,
        "GPUFLEET_API_PROCESSES": "2",
        "GPUFLEET_LISTEN_ADDRESS": "127.0.0.1:0",
    }
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet.scheduler"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "api_processes > 1 needs PostgreSQL" in done.stderr
