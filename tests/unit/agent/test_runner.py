"""The runner: outcome rules from a table, and real (tiny) job processes behind a slot
launcher, timed on a manual clock."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import pytest

from gpufleet.agent import lease, platform_kills
from gpufleet.agent.launcher import CurrentUserLauncher, OpenSlot, SlotError, SlotLauncher
from gpufleet.agent.runner import Runner, job_base_environment
from gpufleet.agent.specs import AttemptResult, JobSpec, Outcome
from gpufleet.agent.statedir import AttemptFiles, StateDir
from gpufleet.agent.verdict import StopReason, decide_outcome, exit_code_of, is_disruption
from gpufleet.common.clock import ManualClock
from gpufleet.common.lease_fence import runner_fence_s
from tests.unit.agent.factories import spec


@pytest.mark.parametrize(
    ("exit_code", "stopped", "outcome", "message"),
    [
        (0, None, Outcome.SUCCEEDED, ""),
        (3, None, Outcome.FAILED, "exited with code 3"),
        (137, None, Outcome.FAILED, "killed by SIGKILL"),
        (143, StopReason.CANCELLED, Outcome.CANCELLED, "cancelled: user"),
        (0, StopReason.CANCELLED, Outcome.CANCELLED, "cancelled"),
        (143, StopReason.TIMED_OUT, Outcome.TIMED_OUT, "time limit"),
        (143, StopReason.RUNNER_STOPPED, Outcome.INFRA_ERROR, "runner was stopped"),
        (0, StopReason.RUNNER_STOPPED, Outcome.INFRA_ERROR, "runner was stopped"),
        # The lease's fence: ours, whatever the job's exit says.
        (143, StopReason.LEASE_FENCED, Outcome.INFRA_ERROR, "lease fence"),
        (0, StopReason.LEASE_FENCED, Outcome.INFRA_ERROR, "lease fence"),
    ],
)
def test_outcome_rules(exit_code: int, stopped: StopReason | None, outcome: Outcome, message: str) -> None:
    decided, text = decide_outcome(exit_code, stopped, "user" if exit_code else "")
    assert decided is outcome
    assert message in text


@pytest.mark.parametrize(
    ("exit_code", "stopped", "platform", "oom", "outcome", "message"),
    [
        # The platform said it would kill the job: ours, whatever the exit code reads.
        (137, None, "slot 0 wiped", False, Outcome.INFRA_ERROR, "killed by the platform (slot 0 wiped)"),
        (1, None, "machine stopped", False, Outcome.INFRA_ERROR, "killed by the platform"),
        (137, None, "slot 0 wiped", True, Outcome.INFRA_ERROR, "killed by the platform"),
        # It finished anyway: its verdict stands.
        (0, None, "slot 0 wiped", False, Outcome.SUCCEEDED, ""),
        # The runner's own kills say what they were.
        (143, StopReason.CANCELLED, "slot 0 wiped", False, Outcome.CANCELLED, "cancelled"),
        (143, StopReason.TIMED_OUT, "", False, Outcome.TIMED_OUT, "time limit"),
        # No record: the job's own, its memory limit included.
        (137, None, "", True, Outcome.FAILED, "killed by SIGKILL at its memory limit (out of memory)"),
        (137, None, "", False, Outcome.FAILED, "killed by SIGKILL"),
        (3, None, "", True, Outcome.FAILED, "exited with code 3"),
    ],
)
def test_a_kill_is_the_platforms_only_when_the_platform_recorded_it(
    exit_code: int, stopped: StopReason | None, platform: str, oom: bool, outcome: Outcome, message: str
) -> None:
    decided, text = decide_outcome(exit_code, stopped, killed_by_platform=platform, out_of_memory=oom)
    assert decided is outcome
    assert message in text


@pytest.mark.parametrize(
    ("exit_code", "stopped", "platform", "disrupted"),
    [
        (143, StopReason.LEASE_FENCED, "", True),  # the fence: the control plane was out of reach
        (0, StopReason.RUNNER_STOPPED, "", True),  # the machine stopping under it
        (137, None, "slot 0 wiped", True),  # a kill the agent announced
        # The job's own ends, and a cancel or a time limit, are never disruptions.
        (137, None, "", False),
        (3, None, "", False),
        (143, StopReason.CANCELLED, "", False),
        (143, StopReason.TIMED_OUT, "", False),
        (0, None, "slot 0 wiped", False),  # it finished anyway: succeeded
    ],
)
def test_a_disruption_is_an_infra_error_whose_reason_the_platform_knows(
    exit_code: int, stopped: StopReason | None, platform: str, disrupted: bool
) -> None:
    outcome, _ = decide_outcome(exit_code, stopped, killed_by_platform=platform)
    assert is_disruption(outcome, stopped, platform) is disrupted


def test_a_signal_death_reads_like_the_shell() -> None:
    assert exit_code_of(-9) == 137
    assert exit_code_of(3) == 3


def test_the_job_gets_no_gpufleet_settings_but_the_clock_and_its_spec(tmp_path: Path) -> None:
    env = job_base_environment(
        {"PATH": "/bin", "GPUFLEET_SCHEDULER_ADDRESS": "x", "GPUFLEET_MACHINE_ID": "m"},
        {"GPUFLEET_CLOCK": "scaled", "GPUFLEET_CLOCK_SPEED": "20.0"},
        tmp_path / "spec.json",
        tmp_path / "work",
    )
    assert env == {
        "PATH": "/bin",
        "GPUFLEET_CLOCK": "scaled",
        "GPUFLEET_CLOCK_SPEED": "20.0",
        "GPUFLEET_JOB_SPEC": str(tmp_path / "spec.json"),
        "GPUFLEET_JOB_DIR": str(tmp_path / "work"),
    }


class PrefixSlot:
    """An open slot that runs the job behind an ``env`` prefix, to see the seam is used."""

    def __init__(
        self, launcher: PrefixLauncher, spec: JobSpec, files: AttemptFiles, pipeline_dir: Path
    ) -> None:
        self.launcher = launcher
        self.spec = spec
        self.files = files
        self.pipeline_dir = pipeline_dir
        files.work.mkdir()

    @property
    def job_dir(self) -> Path:
        return self.files.work

    def command(self, pipeline_command: Sequence[str]) -> list[str]:
        return ["/usr/bin/env", f"WALL=slot-{self.spec.slot}", *pipeline_command]

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        return {**base, "SLOT": str(self.spec.slot)}

    def preexec(self) -> Callable[[], None] | None:
        return None

    def signal(self, job_pid: int, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job_pid, signum)

    def out_of_memory(self) -> bool:
        return self.launcher.out_of_memory

    def close(self) -> None:
        self.launcher.closed.append(self.spec.slot)
        shutil.rmtree(self.files.work)


class PrefixLauncher:
    """Stands for the walled launcher: a slot to open (or fail to), a prefix, a close."""

    name = "prefix"

    def __init__(self, fail_open: bool = False, out_of_memory: bool = False) -> None:
        self.fail_open = fail_open
        self.out_of_memory = out_of_memory
        self.closed: list[int] = []

    def open_slot(self, spec: JobSpec, files: AttemptFiles, pipeline_dir: Path) -> OpenSlot:
        if self.fail_open:
            raise SlotError("could not create the slot user")
        return PrefixSlot(self, spec, files, pipeline_dir)

    def reclaim(self, spec: JobSpec, files: AttemptFiles) -> None:
        self.closed.append(spec.slot)


def make_runner(
    tmp_path: Path, job: JobSpec, script: str, clock: ManualClock, launcher: SlotLauncher | None = None
) -> Runner:
    files = AttemptFiles(tmp_path / job.attempt_id)
    files.folder.mkdir()
    job.save(files.spec)
    return Runner(
        files,
        job,
        clock,
        launcher or CurrentUserLauncher(),
        [sys.executable, "-c", script],
        {"GPUFLEET_CLOCK": "real"},
        poll_s=0.02,
        kill_grace_s=2,
        pipelines_root=tmp_path / "pipelines",
    )


SHOW = (
    "import json, os; spec = json.load(open(os.environ['GPUFLEET_JOB_SPEC'])); "
    "print(os.environ['WALL'], os.environ['SLOT'], spec['tenant_values']['v'], os.getcwd()); "
    "raise SystemExit(4)"
)


def test_the_job_runs_behind_the_launcher_and_its_exit_is_the_verdict(tmp_path: Path) -> None:
    launcher = PrefixLauncher()
    runner = make_runner(tmp_path, spec("a-1", slot=2, v="$(id)"), SHOW, ManualClock(), launcher)
    result = runner.run()
    assert (result.outcome, result.exit_code) == (Outcome.FAILED, 4)
    assert AttemptResult.load(runner.files.result) == result
    assert runner.files.job_log.read_text().split() == ["slot-2", "2", "$(id)", str(runner.files.work)]
    assert launcher.closed == [2]
    assert not runner.files.work.exists()  # the job's folder is removed whatever happened


def test_a_slot_that_cannot_be_closed_off_runs_nothing(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, spec("a-1"), "print('ran')", ManualClock(), PrefixLauncher(fail_open=True))
    result = runner.run()
    assert result.outcome is Outcome.INFRA_ERROR
    assert result.slot_not_closed  # the scheduler records slot_could_not_be_closed, uncharged
    assert "slot" in result.message
    assert not runner.files.job_log.exists()


def test_a_missing_pipeline_is_an_infra_error(tmp_path: Path) -> None:
    job = spec("a-1")
    files = AttemptFiles(tmp_path / "a-1")
    files.folder.mkdir()
    runner = Runner(
        files,
        job,
        ManualClock(),
        CurrentUserLauncher(),
        ["/nonexistent/pipeline"],
        {},
        poll_s=0.02,
        kill_grace_s=1,
        pipelines_root=tmp_path / "pipelines",
    )
    assert runner.run().outcome is Outcome.INFRA_ERROR


def run_in_thread(runner: Runner) -> tuple[threading.Thread, list[AttemptResult]]:
    results: list[AttemptResult] = []
    thread = threading.Thread(target=lambda: results.append(runner.run()))
    thread.start()
    return thread, results


def wait_started(runner: Runner) -> None:
    for _ in range(500):
        if runner.files.runner_state.exists():
            return
        threading.Event().wait(0.01)
    raise AssertionError("job never started")


SLEEP = "import time; time.sleep(60)"


def test_the_time_limit_is_the_clock_s_and_charges_every_slot_held(tmp_path: Path) -> None:
    clock = ManualClock()
    job = JobSpec(attempt_id="a-1", job_id="j", slot=0, slots=3, time_limit_s=600)
    runner = make_runner(tmp_path, job, SLEEP, clock)
    thread, results = run_in_thread(runner)
    wait_started(runner)
    clock.advance(599)
    thread.join(0.3)
    assert thread.is_alive()  # one clock second short of the limit
    clock.advance(1)
    thread.join(10)
    assert results[0].outcome is Outcome.TIMED_OUT
    assert results[0].slot_seconds == 600 * 3


def test_a_cancel_marker_stops_the_job(tmp_path: Path) -> None:
    clock = ManualClock()
    runner = make_runner(tmp_path, spec("a-1"), SLEEP, clock)
    thread, results = run_in_thread(runner)
    wait_started(runner)
    clock.advance(42)
    runner.files.cancel.write_text("user asked\n")
    thread.join(10)
    assert (results[0].outcome, results[0].message, results[0].slot_seconds) == (
        Outcome.CANCELLED,
        "cancelled: user asked",
        42,
    )


def test_a_runner_told_to_stop_reports_infra_error(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, spec("a-1"), SLEEP, ManualClock())
    thread, results = run_in_thread(runner)
    wait_started(runner)
    runner.on_signal(15)
    thread.join(10)
    assert results[0].outcome is Outcome.INFRA_ERROR


def test_a_second_run_keeps_the_first_verdict(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, spec("a-1"), "raise SystemExit(0)", ManualClock())
    first = runner.run()
    runner.pipeline_command = [sys.executable, "-c", "raise SystemExit(9)"]
    assert runner.run() == first


def job_pid(runner: Runner) -> int:
    wait_started(runner)
    return int(json.loads(runner.files.runner_state.read_text())["job_pid"])


def test_a_job_that_kills_itself_fails_on_its_own_account(tmp_path: Path) -> None:
    runner = make_runner(
        tmp_path, spec("a-1"), "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", ManualClock()
    )
    result = runner.run()
    assert (result.outcome, result.exit_code) == (Outcome.FAILED, 137)
    assert result.message == "the job was killed by SIGKILL"


def test_a_kill_the_platform_recorded_first_is_the_platforms(tmp_path: Path) -> None:
    runner = make_runner(tmp_path, spec("a-1"), SLEEP, ManualClock())
    thread, results = run_in_thread(runner)
    pid = job_pid(runner)
    platform_kills.record_attempt_kill(runner.files, "slot 0 wiped for attempt a-2")
    os.killpg(pid, signal.SIGKILL)
    thread.join(10)
    assert (results[0].outcome, results[0].exit_code) == (Outcome.INFRA_ERROR, 137)
    assert "slot 0 wiped for attempt a-2" in results[0].message


def test_every_job_killed_while_its_machine_stops_is_the_platforms(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state").ensure()
    runner = make_runner(state.attempts, spec("a-1"), SLEEP, ManualClock())
    thread, results = run_in_thread(runner)
    pid = job_pid(runner)
    platform_kills.record_machine_stop(state.root, "the machine was stopped by the provisioner")
    os.killpg(pid, signal.SIGTERM)
    thread.join(10)
    assert (results[0].outcome, results[0].exit_code) == (Outcome.INFRA_ERROR, 143)
    assert "stopped by the provisioner" in results[0].message
    platform_kills.clear_machine_stop(state.root)  # started again: deaths are the jobs' own
    assert platform_kills.recorded_kill(runner.files) == ""


def test_a_job_killed_at_its_memory_limit_fails_on_its_own_account(tmp_path: Path) -> None:
    die = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    runner = make_runner(tmp_path, spec("a-1"), die, ManualClock(), PrefixLauncher(out_of_memory=True))
    result = runner.run()
    assert (result.outcome, result.exit_code) == (Outcome.FAILED, 137)
    assert result.message == "the job was killed by SIGKILL at its memory limit (out of memory)"


def test_a_job_whose_lease_goes_unrenewed_past_the_fence_is_stopped_as_ours(tmp_path: Path) -> None:
    clock = ManualClock()
    job = spec("a-1")
    runner = make_runner(tmp_path, job, SLEEP, clock)
    lease.renew(runner.files, clock.now(), 90.0)  # as the worker does at launch
    thread, results = run_in_thread(runner)
    wait_started(runner)
    clock.advance(runner_fence_s(90.0) - 1)
    thread.join(0.3)
    assert thread.is_alive()  # one clock second short of the fence
    clock.advance(1)
    thread.join(10)
    assert results[0].outcome is Outcome.INFRA_ERROR
    assert "lease fence" in results[0].message and "45 s" in results[0].message
    # The platform's own reason: the scheduler spends no retry of the job's on it.
    assert results[0].disrupted
    assert AttemptResult.load(runner.files.result) == results[0]


def test_each_renewal_moves_the_fence(tmp_path: Path) -> None:
    clock = ManualClock()
    runner = make_runner(tmp_path, spec("a-1"), SLEEP, clock)
    lease.renew(runner.files, clock.now(), 90.0)
    thread, results = run_in_thread(runner)
    wait_started(runner)
    for _ in range(4):  # 120 clock seconds in all, renewed every 30
        clock.advance(30)
        lease.renew(runner.files, clock.now(), 90.0)
    thread.join(0.3)
    assert thread.is_alive()
    runner.files.cancel.write_text("done\n")
    thread.join(10)
    assert results[0].outcome is Outcome.CANCELLED


def test_a_fenced_job_that_ignores_sigterm_is_killed_inside_the_margin(tmp_path: Path) -> None:
    clock = ManualClock()
    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('deaf', flush=True); time.sleep(60)"
    )
    runner = make_runner(tmp_path, spec("a-1"), stubborn, clock)
    runner.kill_grace_s = 60.0  # far past any margin: the fence's cap must win
    lease.renew(runner.files, clock.now(), 90.0)
    thread, results = run_in_thread(runner)
    wait_started(runner)
    for _ in range(500):  # until SIGTERM is ignored
        if runner.files.job_log.exists() and "deaf" in runner.files.job_log.read_text():
            break
        threading.Event().wait(0.01)
    clock.advance(runner_fence_s(90.0))
    thread.join(10)  # the manual clock's real_seconds(cap) is 0.05 s, not 60 s
    assert not thread.is_alive()
    assert (results[0].outcome, results[0].exit_code) == (Outcome.INFRA_ERROR, 137)


def test_an_attempt_without_a_lease_file_is_not_fenced(tmp_path: Path) -> None:
    clock = ManualClock()
    runner = make_runner(tmp_path, spec("a-1"), SLEEP, clock)
    thread, results = run_in_thread(runner)
    wait_started(runner)
    clock.advance(10_000)
    thread.join(0.3)
    assert thread.is_alive()
    runner.files.cancel.write_text("done\n")
    thread.join(10)
    assert results[0].outcome is Outcome.CANCELLED
