"""Two stacks and a test run on one host: the same machine number, the same machine id,
real slot users, namespaces and cgroups — and nothing of one reaches another.

Machine 0 of two `gpufleet up` stacks (their walls names are what the local driver gives
them: their local roots' and their number's) and an agent of a test run (its default
names: its deployment's, machine's and state folder's) each wipe their slots before and
after every job — killing every process of their slot users. Each one's users, walls
folder and jobs' cgroup are its own, so a job of one runs to success while the others'
jobs start and end and their wipes run.
"""

from __future__ import annotations

import itertools
import os
import pwd
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.agent.settings import Settings
from gpufleet.agent.walls.launcher import clean_slot
from gpufleet.agent.walls.setup import walls_config
from gpufleet.agent.walls.wipe import processes_of
from gpufleet.common import host_release
from gpufleet.common.host_names import local_walls_name
from gpufleet.v1 import job_pb2
from tests.integration.agent.conftest import AgentLauncher, AgentProcess, start_request, wait_running
from tests.integration.agent.fake_scheduler import FakeWorkerService, wait_for

SLOTS = 2
MACHINE = "machine-0"  # the same id in every stack


@pytest.fixture(scope="module")
def agents(launcher: AgentLauncher, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[AgentProcess]]:
    base = tmp_path_factory.mktemp("host")
    started = []
    for stack in ("stack-a", "stack-b", "test-run"):
        state = base / stack / "machines" / MACHINE / "disk"
        state.mkdir(parents=True)
        # Two stacks' machine 0 as their local drivers name it; a test run's agent by default.
        walls_name = None if stack == "test-run" else local_walls_name(base / stack / "machines", 0)
        started.append(launcher.start(state, slots=SLOTS, machine_id=MACHINE, walls_name=walls_name))
    yield started


def host_wide_names(agent: AgentProcess) -> set[str]:
    users = {agent.names.slot_user(slot) for slot in range(SLOTS)}
    return {*users, str(agent.names.walls_root), agent.names.jobs_cgroup}


def test_no_two_agents_share_a_user_a_folder_or_a_cgroup(agents: list[AgentProcess]) -> None:
    for one, other in itertools.combinations(agents, 2):
        assert not host_wide_names(one) & host_wide_names(other)
    uids = [pwd.getpwnam(a.names.slot_user(slot)).pw_uid for a in agents for slot in range(SLOTS)]
    assert len(set(uids)) == len(uids)
    for agent in agents:  # the users the agent made are the ones its names say
        assert pwd.getpwnam(agent.names.slot_user(0)).pw_dir == str(agent.names.walls_root / "homes" / "0")


def wipe_every_slot(agent: AgentProcess) -> None:
    """The agent's own wipe of each of its slots, as opening a slot for a job runs it."""
    settings = Settings(
        machine_id=agent.machine_id,
        agent_state_dir=agent.state_dir,
        walls_name=agent.names.walls_name,
        slots=SLOTS,
    )
    config = walls_config(settings)
    for slot in range(SLOTS):
        clean_slot(config, config.user(slot), acting_for=f"wipe-{slot}")


def test_a_job_of_one_stack_runs_to_success_through_the_others_wipes(
    agents: list[AgentProcess], fake_scheduler: FakeWorkerService
) -> None:
    mine, *others = agents
    with mine.client() as client:
        client.start_job(start_request("stack-a-long", slot=0, duration_s=200))  # 10 s of real time
    wait_running(mine, "stack-a-long")
    my_user = pwd.getpwnam(mine.names.slot_user(0)).pw_uid
    wait_for(lambda: processes_of(my_user), what="stack A's job running as its slot 0 user")

    # The others run jobs on the same slot numbers — a wipe before and after each — and
    # wipe every slot of theirs besides.
    others_jobs = [f"{name}-{slot}-{n}" for name in ("b", "t") for slot in range(SLOTS) for n in range(2)]
    for other, prefix in zip(others, ("b", "t"), strict=True):
        with other.client() as client:
            for slot in range(SLOTS):
                client.start_job(start_request(f"{prefix}-{slot}-0", slot=slot, duration_s=2))
    for other, prefix in zip(others, ("b", "t"), strict=True):
        for slot in range(SLOTS):
            wait_for(lambda a=f"{prefix}-{slot}-0": fake_scheduler.completion(a), what=f"{prefix}-{slot}-0")
        with other.client() as client:
            for slot in range(SLOTS):
                client.start_job(start_request(f"{prefix}-{slot}-1", slot=slot, duration_s=2))
        wipe_every_slot(other)
    for attempt_id in others_jobs:
        result = wait_for(
            lambda a=attempt_id: fake_scheduler.completion(a), what=f"completion of {attempt_id}"
        )
        assert result.outcome == job_pb2.ATTEMPT_STATE_SUCCEEDED, (attempt_id, result.message)  # type: ignore[attr-defined]

    # All of that happened while stack A's job ran, untouched.
    assert fake_scheduler.completion("stack-a-long") is None, "stack A's job ended during the others' wipes"
    assert processes_of(my_user)
    result = wait_for(lambda: fake_scheduler.completion("stack-a-long"), timeout=60, what="stack A's job")
    assert (result.outcome, result.exit_code) == (job_pb2.ATTEMPT_STATE_SUCCEEDED, 0), result.message  # type: ignore[attr-defined]


def test_each_agent_wipes_only_its_own_slot_users(agents: list[AgentProcess]) -> None:
    """What the test run's agent wipes are its users only: the stacks' are other users."""
    _, _, test_run = agents
    settings = Settings(
        machine_id=test_run.machine_id,
        agent_state_dir=test_run.state_dir,
        walls_name=test_run.names.walls_name,
        slots=SLOTS,
    )
    assert {u.name for u in walls_config(settings).users} == {
        test_run.names.slot_user(s) for s in range(SLOTS)
    }
    # The agent's default names are its deployment's, machine's and state folder's.
    derived = Settings(machine_id=MACHINE, agent_state_dir=test_run.state_dir).host_names
    assert derived == test_run.names


def test_a_machine_killed_mid_job_is_given_back_whole(launcher: AgentLauncher, tmp_path: Path) -> None:
    """Its slot users, its walls folder and its jobs' cgroups — the one of the job its
    killed runner never removed included — and nothing of the other agents'."""
    state = tmp_path / "state"
    state.mkdir()
    agent = launcher.start(state, slots=SLOTS, machine_id="killed-0")
    with agent.client() as client:
        client.start_job(start_request("killed-mid-job", slot=1, duration_s=600))
    wait_running(agent, "killed-mid-job")
    group = agent.names.jobs_cgroup
    os.killpg(agent.proc.pid, signal.SIGKILL)
    agent.proc.wait(timeout=10)
    assert cgroups_named(group), "no cgroup of the machine's group left behind by its killed runner"

    assert host_release.release(agent.names) == []
    assert not [u.pw_name for u in pwd.getpwall() if u.pw_name.startswith(agent.names.slot_user_prefix)]
    assert not agent.names.walls_root.exists()
    assert cgroups_named(group) == []


def cgroups_named(name: str) -> list[Path]:
    """Wherever the agent put it: at a hierarchy's root, or below its own cgroup (v1)."""
    depths = ("*", "*/*", "*/*/*", "*/*/*/*", "*/*/*/*/*")
    return [p for d in depths for p in Path("/sys/fs/cgroup").glob(f"{d}/{name}") if p.is_dir()]
