"""The escape suite: a real agent with two walled slots, and a job in slot A that tries to
cross every wall of DESIGN §10 while slot B's job and the agent are live.

Everything is real: the agent, worker and runners are processes, the slots are Linux
users, the walls are bubblewrap namespaces and cgroups. The probe job
(``escape_pipeline/probe_job.py``) is installed as the pipeline, like a tenant's code,
and reports each attempt as a JSON line; a crossing that succeeds fails the test with the
name of the wall that did not hold.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.agent.walls.wipe import processes_of
from gpufleet.common.errors import FailedPrecondition
from gpufleet.common.host_names import HostNames
from gpufleet.v1 import job_pb2
from tests.integration.agent.conftest import AgentLauncher, AgentProcess, start_request
from tests.integration.agent.fake_scheduler import FakeWorkerService, wait_for

PIPELINE = Path(__file__).with_name("escape_pipeline")
# The escape suite's machine's host-wide names: this run's own.
ESCAPE = HostNames(f"esc{secrets.token_hex(3)}")
# Credentials the agent holds in its own environment: none may reach a job.
AGENT_SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "sekrit-aws",
    "GOOGLE_APPLICATION_CREDENTIALS": "/var/sekrit/gcp.json",
    "GPUFLEET_DATABASE_URL": "postgresql://gpufleet:sekrit@db/gpufleet",
}


@pytest.fixture(scope="module")
def walls_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="gfwalls-", dir="/tmp"))
    root.chmod(0o711)  # slot users reach their own folders through it
    yield root
    subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


@pytest.fixture(scope="module")
def walled(
    launcher: AgentLauncher, walls_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> AgentProcess:
    state = tmp_path_factory.mktemp("escape") / "state"
    state.mkdir()
    return launcher.start(
        state,
        slots=2,
        machine_id="escape-1",
        walls_name=ESCAPE.walls_name,
        extra_env={
            "GPUFLEET_WALLS_ROOT": str(walls_root / "machine"),
            "GPUFLEET_PIPELINE_SOURCE": str(PIPELINE),
            "GPUFLEET_PIPELINE_COMMAND": json.dumps(["python3", "-I", "{pipeline_dir}/probe_job.py"]),
            **AGENT_SECRETS,
        },
    )


def slot_user(slot: int) -> pwd.struct_passwd:
    return pwd.getpwnam(ESCAPE.slot_user(slot))


def uid(slot: int) -> int:
    return slot_user(slot).pw_uid


def job(attempt_id: str, role: str, *, slot: int, params: dict[str, object] | None = None, **fields: object):  # type: ignore[no-untyped-def]
    request = start_request(
        attempt_id, slot=slot, tenant_values={"role": role, "params": json.dumps(params or {})}
    )
    for name, value in fields.items():
        setattr(request, name, value)
    return request


def log_of(agent: AgentProcess, attempt_id: str) -> str:
    """The attempt's log wherever it is. The agent files a folder away (one rename) just
    after its completion is acknowledged, so it can move between the two looks: finished is
    looked in again last, and a log is never missed in mid-move."""
    for folder in ("finished", "attempts", "finished"):
        path = agent.state_dir / folder / attempt_id / "job.log"
        if path.exists():
            return path.read_text()
    return ""


def checks(log: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith('{"check"')]


def completed(fake: FakeWorkerService, attempt_id: str, timeout: float = 60) -> object:
    return wait_for(lambda: fake.completion(attempt_id), timeout=timeout, what=f"completion of {attempt_id}")


def assert_held(found: list[dict[str, object]], at_least: int) -> None:
    crossed = [f"{c['check']}: {c['detail']}" for c in found if c["crossed"]]
    assert not crossed, "walls that did not hold:\n" + "\n".join(crossed)
    assert len(found) >= at_least, f"only {len(found)} crossing attempts ran"


@pytest.fixture
def victim(walled: AgentProcess, fake_scheduler: FakeWorkerService) -> Iterator[str]:
    """Slot B's job, alive for the whole test, with things left for A to find."""
    attempt_id = f"victim-{time.monotonic_ns()}"
    with walled.client() as client:
        client.start_job(job(attempt_id, "victim", slot=1, params={"live_s": 600}))
    wait_for(lambda: '"victim": "ready"' in log_of(walled, attempt_id), what="the victim ready")
    yield attempt_id
    with walled.client() as client:
        client.cancel_job(attempt_id, "test over")
    completed(fake_scheduler, attempt_id)
    assert_held(checks(log_of(walled, attempt_id)), at_least=0)  # B never saw A's files


def b_alive(attempt_id: str) -> bool:
    return bool(processes_of(uid(1))) and not Path(f"/tmp/{attempt_id}").exists()


def test_slot_a_cannot_cross_any_wall_to_slot_b_or_the_machine(
    walled: AgentProcess, fake_scheduler: FakeWorkerService, victim: str, walls_root: Path
) -> None:
    jobs_dir = walls_root / "machine" / "jobs"
    b_pids = processes_of(uid(1))
    assert b_pids, "slot B's job is not running as slot B's user"
    listener = socket.create_server(("127.0.0.1", 0))  # stands for every control-plane port
    etc_before = os.stat("/etc")
    passwd_before = Path("/etc/passwd").read_bytes()
    params = {
        "b_job_dir": str(jobs_dir / victim),
        "b_attempt": victim,
        "b_pids": b_pids,
        "agent_pid": walled.proc.pid,
        "jobs_dir": str(jobs_dir),
        "attempts_dir": str(walled.state_dir / "attempts"),
        "agent_state_dir": str(walled.state_dir),
        "ports": [walled.port, listener.getsockname()[1], int(walled.address.rsplit(":", 1)[1])],
        "host_hostname": socket.gethostname(),
    }
    with listener, walled.client() as client:
        client.start_job(job("prober-1", "prober", slot=0, params=params))
        result = completed(fake_scheduler, "prober-1")
    log = log_of(walled, "prober-1")
    assert result.outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED, log  # type: ignore[attr-defined]
    assert_held(checks(log), at_least=45)
    # B kept running through all of it, and its folder was never A's to touch.
    assert processes_of(uid(1)), "slot B's job did not survive slot A's attempts"
    assert (jobs_dir / victim / "b-secret").read_text() == "b-secret"
    # After the job: nothing of A is left, and the wipe followed no planted link.
    assert not (jobs_dir / "prober-1").exists()
    assert not processes_of(uid(0))
    assert list(Path(slot_user(0).pw_dir).iterdir()) == []
    for place in ("/tmp", "/var/tmp", "/dev/shm"):
        assert not Path(place, "a-was-here").exists(), f"A's file escaped into the host's {place}"
    etc_after = os.stat("/etc")
    assert (etc_after.st_uid, etc_after.st_gid, etc_after.st_mode) == (
        etc_before.st_uid,
        etc_before.st_gid,
        etc_before.st_mode,
    )
    assert Path("/etc/passwd").read_bytes() == passwd_before


def test_a_fork_bomb_and_a_memory_balloon_stay_in_their_slot(
    walled: AgentProcess, fake_scheduler: FakeWorkerService, victim: str
) -> None:
    with walled.client() as client:
        client.start_job(job("forkbomb-1", "forkbomb", slot=0, pids_limit=64))
        bomb = completed(fake_scheduler, "forkbomb-1")
        log = log_of(walled, "forkbomb-1")
        assert checks(log), f"the fork bomb reported nothing: {bomb}\n{log[-2000:]}"
        assert_held(checks(log), at_least=1)
        assert processes_of(uid(1)), "slot B died of slot A's fork bomb"
        client.start_job(job("balloon-1", "balloon", slot=0, memory_limit_bytes=128 << 20))
        result = completed(fake_scheduler, "balloon-1")
    log = log_of(walled, "balloon-1")
    assert_held(checks(log), at_least=0)
    assert result.outcome == job_pb2.ATTEMPT_STATE_FAILED, log  # type: ignore[attr-defined]
    assert "SIGKILL" in result.message  # type: ignore[attr-defined]
    assert processes_of(uid(1)), "slot B died of slot A's memory balloon"


def test_nothing_a_job_started_outlives_it(walled: AgentProcess, fake_scheduler: FakeWorkerService) -> None:
    with walled.client() as client:
        client.start_job(job("daemon-1", "daemon", slot=0))
        result = completed(fake_scheduler, "daemon-1")
    assert '"daemons": "started"' in log_of(walled, "daemon-1")
    assert result.outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED  # type: ignore[attr-defined]
    assert processes_of(uid(0)) == [], "a process the job left behind is still running"
    leftovers = [p for p in Path("/sys/fs/cgroup").rglob("daemon-1") if p.is_dir()]
    assert leftovers == [], f"the job's cgroup is still there: {leftovers}"


PAYLOADS = {
    "subshell": "$(touch /tmp/gfesc-pwned-1)",
    "backticks": "`touch /tmp/gfesc-pwned-2`",
    "chain": "x; touch /tmp/gfesc-pwned-3 && echo",
    "quotes": "'\"; touch /tmp/gfesc-pwned-4; echo \"'",
    "newline": "a\ntouch /tmp/gfesc-pwned-5",
}


def test_tenant_values_never_reach_a_shell_behind_the_walls(
    walled: AgentProcess, fake_scheduler: FakeWorkerService
) -> None:
    request = job("echo-1", "echo", slot=0)
    request.tenant_values.update(PAYLOADS)
    with walled.client() as client:
        client.start_job(request)
        completed(fake_scheduler, "echo-1")
    echoed = next(line for line in log_of(walled, "echo-1").splitlines() if line.startswith("tenant_values "))
    values = json.loads(echoed.removeprefix("tenant_values "))
    assert {k: values[k] for k in PAYLOADS} == PAYLOADS
    assert not list(Path("/tmp").glob("gfesc-pwned-*"))


@pytest.fixture(scope="module")
def test_host() -> Iterator[tuple[str, int]]:
    """A stand-in for the internet: an HTTP server in a network namespace of our own, at a
    documentation address (198.51.100.2) reachable only over a veth pair we made."""
    name = f"gfesc{os.getpid() % 100000}"
    ip = ["ip"]
    subprocess.run([*ip, "netns", "add", name], check=True)
    server = None
    try:
        subprocess.run(
            [*ip, "link", "add", f"{name}h", "type", "veth", "peer", "name", f"{name}n"], check=True
        )
        subprocess.run([*ip, "link", "set", f"{name}n", "netns", name], check=True)
        subprocess.run([*ip, "addr", "add", "198.51.100.1/30", "dev", f"{name}h"], check=True)
        subprocess.run([*ip, "link", "set", f"{name}h", "up"], check=True)
        inside = [*ip, "netns", "exec", name]
        subprocess.run([*inside, "ip", "addr", "add", "198.51.100.2/30", "dev", f"{name}n"], check=True)
        subprocess.run([*inside, "ip", "link", "set", f"{name}n", "up"], check=True)
        subprocess.run([*inside, "ip", "link", "set", "lo", "up"], check=True)
        served = tempfile.mkdtemp()
        Path(served, "index.html").write_text("signed media link\n")
        server = subprocess.Popen(
            [
                *inside,
                "python3",
                "-m",
                "http.server",
                "8080",
                "--bind",
                "198.51.100.2",
                "--directory",
                served,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def up() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("198.51.100.2", 8080), timeout=1):
                return True
            return False

        wait_for(up, what="the test host's HTTP server")
        yield "198.51.100.2", 8080
    finally:
        if server is not None:
            server.kill()
            server.wait()
        subprocess.run([*ip, "link", "del", f"{name}h"], check=False)
        subprocess.run([*ip, "netns", "del", name], check=False)


def test_platform_code_goes_out_only_through_the_filter(
    walled: AgentProcess, fake_scheduler: FakeWorkerService, test_host: tuple[str, int]
) -> None:
    refused = [
        ["169.254.169.254", 80],
        ["metadata.google.internal", 80],
        ["10.0.0.1", 80],
        ["192.168.1.1", 443],
        ["127.0.0.1", walled.port],
        ["localhost", walled.port],
        ["::1", walled.port],
        ["198.51.100.1", 8080],  # the host's own address on the veth
    ]
    params = {"refused": refused, "allowed": list(test_host)}
    with walled.client() as client:
        client.start_job(job("egress-1", "egress", slot=0, params=params, outbound_network=True))
        completed(fake_scheduler, "egress-1")
    log = log_of(walled, "egress-1")
    assert_held(checks(log), at_least=len(refused) + 3)
    assert '"allowed": "HTTP/1.0 200 OK' in log, log


def test_a_writer_code_kind_gets_no_proxy(walled: AgentProcess, fake_scheduler: FakeWorkerService) -> None:
    with walled.client() as client:
        client.start_job(job("egress-closed", "egress", slot=0, params={"refused": []}))
        completed(fake_scheduler, "egress-closed")
    found = {c["check"]: c for c in checks(log_of(walled, "egress-closed"))}
    assert found["egress proxy offered"]["crossed"]  # inverted check: no proxy is the wall holding
    assert not found["connect to the cloud metadata service directly"]["crossed"]


def test_every_kind_runs_behind_the_walls(
    launcher: AgentLauncher, walls_root: Path, tmp_path: Path, fake_scheduler: FakeWorkerService
) -> None:
    """The bundled sample pipeline, for a short episode, a film holding every slot and a clip
    (the platform's own code, with the egress proxy), each as its slot's user."""
    agent = launcher.start(
        tmp_path / "state",
        slots=2,
        machine_id="escape-kinds",
        extra_env={"GPUFLEET_WALLS_ROOT": str(walls_root / "kinds")},
    )
    kinds = [("short_episode", 0, 1, False), ("film", 0, 2, False), ("clip", 1, 1, True)]
    with agent.client() as client:
        for kind, slot, slots, outbound in kinds:
            request = start_request(f"kind-{kind}", slot=slot, slots=slots, duration_s=20)
            request.kind = kind
            request.outbound_network = outbound
            client.start_job(request)
            result = completed(fake_scheduler, f"kind-{kind}")
            log = log_of(agent, f"kind-{kind}")
            assert result.outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED, log  # type: ignore[attr-defined]
            assert "sample pipeline: done" in log
            assert "cannot write" not in log


def test_a_slot_that_cannot_be_closed_runs_nothing_and_says_why(
    walled: AgentProcess, fake_scheduler: FakeWorkerService, walls_root: Path
) -> None:
    """Slot 0's home replaced by a link to /etc (by someone with root on the machine): the
    wipe refuses to follow it, so the slot cannot be made clean and the job never starts."""
    home = walls_root / "machine" / "homes" / "0"
    etc_before = sorted(p.name for p in Path("/etc").iterdir())
    subprocess.run(["rm", "-rf", str(home)], check=True)
    home.symlink_to("/etc")
    try:
        with walled.client() as client:
            client.start_job(job("unclosable-1", "echo", slot=0))
            result = completed(fake_scheduler, "unclosable-1")
    finally:
        home.unlink()
        home.mkdir(mode=0o700)
        os.chown(home, uid(0), slot_user(0).pw_gid)
    assert result.outcome == job_pb2.ATTEMPT_STATE_INFRA_ERROR  # type: ignore[attr-defined]
    assert result.slot_not_closed  # type: ignore[attr-defined]
    assert "slot could not be closed" in result.message  # type: ignore[attr-defined]
    assert log_of(walled, "unclosable-1") == ""  # nothing ran
    assert sorted(p.name for p in Path("/etc").iterdir()) == etc_before
    assert Path("/etc").stat().st_uid == 0


def test_a_machine_that_cannot_build_the_walls_refuses_every_job_loudly(
    launcher: AgentLauncher, tmp_path: Path, walls_root: Path
) -> None:
    agent = launcher.start(
        tmp_path / "state",
        slots=1,
        machine_id="escape-nowalls",
        extra_env={
            "GPUFLEET_WALLS_ROOT": str(walls_root / "nowalls"),
            "GPUFLEET_BWRAP_PATH": "/nonexistent/bwrap",
        },
    )
    with agent.client() as client:
        probe = client.probe()
        assert not probe.startup_complete
        assert "walls between slots cannot be built" in probe.startup_error
        assert "bwrap" in probe.startup_error
        with pytest.raises(FailedPrecondition, match="walls between slots cannot be built"):
            client.start_job(start_request("nowalls-1"))
    assert not (agent.state_dir / "attempts" / "nowalls-1").exists()
