"""``python -m gpufleet.agent.worker``: runs the machine's jobs and reports for itself.

The worker is the third liveness channel (DESIGN §3): it heartbeats to the scheduler on
its own clock, so a worker that died or wedged behind a perfectly healthy agent goes
silent — which is exactly what the went-silent net watches. It launches a runner per
attempt accepted by the agent, adopts the runners it finds when it starts again, turns a
runner that died without a verdict into INFRA_ERROR, and reports every completion until
the scheduler acknowledges it. All of its state is the state directory; one tick reads
it, acts, and leaves it consistent, so it can be killed at any point.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import IO

from gpufleet.agent import lease
from gpufleet.agent.checkpoints import restore_file
from gpufleet.agent.courier import CheckpointCourier
from gpufleet.agent.gpu_health import health_file
from gpufleet.agent.launcher import CurrentUserLauncher, SlotLauncher
from gpufleet.agent.procs import is_alive
from gpufleet.agent.reporter import GrpcSchedulerReports, ReportRefused, Running, SchedulerReports
from gpufleet.agent.runner_processes import PopenRunnerProcesses, RunnerProcesses
from gpufleet.agent.settings import Settings
from gpufleet.agent.specs import AttemptResult, JobSpec, Outcome, iso
from gpufleet.agent.statedir import (
    ATTEMPT_ID_PATTERN,
    AttemptFiles,
    StateDir,
    atomic_write_text,
    read_json,
    read_pid,
)
from gpufleet.agent.walls.setup import WallsUnavailable, build_launcher
from gpufleet.common.clock import Clock
from gpufleet.common.errors import GpufleetError
from gpufleet.common.signals import stop_on_signals

log = logging.getLogger(__name__)

WORKER_MODULE = "gpufleet.agent.worker"


class Worker:
    """One tick: launch what was accepted, pass on cancels, adopt or settle runners,
    report completions that are due, heartbeat when due."""

    def __init__(
        self,
        state: StateDir,
        clock: Clock,
        reports: SchedulerReports,
        processes: RunnerProcesses,
        *,
        heartbeat_s: float,
        completion_retry_s: float,
        launcher: SlotLauncher | None = None,
        checkpoint_send_per_tick_bytes: int = 8 << 20,
        assumed_lease_s: float = 90.0,
    ) -> None:
        self.state = state
        # The lease the scheduler grants, as its last acknowledged heartbeat said (until
        # one has: the assumed one): every renewal written for a runner carries it.
        self.lease_s = assumed_lease_s
        self.courier = CheckpointCourier(reports, send_per_tick_bytes=checkpoint_send_per_tick_bytes)
        # Closes the slot of an attempt whose runner died (nobody else would wipe it).
        self.launcher = launcher or CurrentUserLauncher()
        self.clock = clock
        self.reports = reports
        self.processes = processes
        self.heartbeat_s = heartbeat_s
        self.completion_retry_s = completion_retry_s
        self._next_heartbeat: datetime | None = None  # None: report as soon as we start
        # A failed completion says the scheduler is unreachable, not that the attempt is
        # wrong: every pending completion waits out one shared, doubling back-off.
        self._completion_failures = 0
        self._completions_due: datetime | None = None

    def run_forever(self, stop: threading.Event, poll_s: float) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # a bad tick must not end the machine's only reporter
                log.exception("worker tick failed")
            stop.wait(poll_s)  # real time: latency of noticing a spec or an exit, not a rule

    def tick(self) -> None:
        now = self.clock.now()
        self._launch_pending()
        self._pass_on_cancels()
        running, ended = self._settle_runners()
        self.courier.send(self.state.attempt(r.attempt_id) for r in running)
        if self._completions_due is None or now >= self._completions_due:
            for files, result in ended:
                if not self._report_completion(now, files, result):
                    break
        if self._next_heartbeat is None or now >= self._next_heartbeat:
            self._heartbeat(now, running)

    def _launch_pending(self) -> None:
        for attempt_id in self.state.pending_ids():
            inbox = self.state.inbox_spec(attempt_id)
            files = self.state.attempt(attempt_id)
            if not self._already_taken(attempt_id):
                try:
                    spec = JobSpec.load(inbox)
                except (KeyError, TypeError, ValueError) as err:
                    log.error("attempt %s: unreadable spec set aside (%s)", attempt_id, err)
                    os.replace(inbox, inbox.with_suffix(".unreadable"))
                    continue
                self._launch(spec, files)
            inbox.unlink(missing_ok=True)

    def _already_taken(self, attempt_id: str) -> bool:
        return any(
            (folder / attempt_id).exists()
            for folder in (self.state.attempts, self.state.finished, self.state.refused)
        )

    def _launch(self, spec: JobSpec, files: AttemptFiles) -> None:
        # The folder appears whole (spec inside) or not at all: a crash leaves no half-attempt.
        staging = self.state.attempts / f".new-{spec.attempt_id}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        spec.save(staging / files.spec.name)
        # Its first lease counts from now: the scheduler's started at dispatch, earlier.
        lease.renew(AttemptFiles(staging), self.clock.now(), self.lease_s)
        if spec.checkpoint_id and not self.state.cancel_request(spec.attempt_id).exists():
            # Read before the folder appears: its runner finds the checkpoint or none.
            self.courier.fetch(spec, staging / restore_file(files).name)
        os.rename(staging, files.folder)
        cancel = self.state.cancel_request(spec.attempt_id)
        if cancel.exists():
            now = iso(self.clock.now())
            AttemptResult(
                spec.attempt_id,
                Outcome.CANCELLED,
                message="cancelled before it started",
                start_time=now,
                end_time=now,
            ).save(files.result)
            cancel.unlink(missing_ok=True)
            return
        pid = self.processes.spawn(files)
        atomic_write_text(files.runner_pid, f"{pid}\n")
        log.info("attempt %s: runner started as pid %d on slot %d", spec.attempt_id, pid, spec.slot)

    def _pass_on_cancels(self) -> None:
        for request in sorted(self.state.cancels.iterdir()):
            if not ATTEMPT_ID_PATTERN.match(request.name):
                continue  # a request still being written
            files = self.state.attempt(request.name)
            if files.folder.is_dir() and not files.result.exists() and not files.cancel.exists():
                atomic_write_text(files.cancel, request.read_text())
                log.info("attempt %s: cancel passed to its runner", request.name)
            if not self.state.inbox_spec(request.name).exists():  # else launch consumes it
                request.unlink(missing_ok=True)

    def _settle_runners(self) -> tuple[list[Running], list[tuple[AttemptFiles, AttemptResult]]]:
        running: list[Running] = []
        ended: list[tuple[AttemptFiles, AttemptResult]] = []
        for files in self.state.attempt_folders():
            # Liveness before the result: a runner writes its verdict, then exits.
            if self.processes.alive(files, read_pid(files.runner_pid)):
                running.append(Running(files.attempt_id, JobSpec.load(files.spec).slot))
                continue
            result = AttemptResult.load(files.result)
            if result is None:
                result = self._runner_lost(files)
            ended.append((files, result))
        return running, ended

    def _runner_lost(self, files: AttemptFiles) -> AttemptResult:
        """The runner died without a verdict: our failure, never the tenant's — and one the
        job cannot have caused (the runner is the platform's process, out of the slot
        user's reach), so it is reported ``disrupted``: it spends no retry of the job's."""
        state = read_json(files.runner_state)
        job_pid = state.get("job_pid") if isinstance(state, dict) else None
        if isinstance(job_pid, int) and is_alive(job_pid, environ=(f"GPUFLEET_JOB_SPEC={files.spec}",)):
            # Nobody would ever time or report it: end the job's whole process group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(job_pid, signal.SIGKILL)
        try:
            self.launcher.reclaim(JobSpec.load(files.spec), files)
        except Exception:  # the verdict below must still be written and reported
            log.exception("attempt %s: its slot could not be reclaimed", files.attempt_id)
        now = iso(self.clock.now())
        result = AttemptResult(
            files.attempt_id,
            Outcome.INFRA_ERROR,
            message="the runner died without writing a result",
            start_time=str(state.get("start_time", "")) if isinstance(state, dict) else "",
            end_time=now,
            disrupted=True,
        )
        result.save(files.result)
        log.warning("attempt %s: runner lost; reporting INFRA_ERROR", files.attempt_id)
        return result

    def _report_completion(self, now: datetime, files: AttemptFiles, result: AttemptResult) -> bool:
        """Report one ended attempt; False when the scheduler could not be reached."""
        try:
            self.reports.complete(result)
        except ReportRefused as err:
            log.error(
                "attempt %s: scheduler refused its completion for good (%s); kept in %s",
                result.attempt_id,
                err,
                self.state.refused,
            )
            atomic_write_text(files.folder / "refusal", f"{err}\n")
            self._file_away(files, self.state.refused)
            return True
        except GpufleetError as err:
            self._completion_failures += 1
            delay = min(self.completion_retry_s * 2 ** (self._completion_failures - 1), self.heartbeat_s)
            self._completions_due = now + timedelta(seconds=delay)
            log.warning(
                "attempt %s: completion not acknowledged (%s); retry in %.1fs", result.attempt_id, err, delay
            )
            return False
        self._completion_failures = 0
        self._completions_due = None
        log.info("attempt %s: completion %s acknowledged", result.attempt_id, result.outcome.value)
        self._file_away(files, self.state.finished)
        return True

    def _file_away(self, files: AttemptFiles, into: Path) -> None:
        target = into / files.attempt_id
        shutil.rmtree(target, ignore_errors=True)
        os.rename(files.folder, target)

    def _heartbeat(self, now: datetime, running: Sequence[Running]) -> None:
        self._next_heartbeat = now + timedelta(seconds=self.heartbeat_s)
        try:
            answer = self.reports.heartbeat(running, now)
        except GpufleetError as err:
            log.warning("heartbeat not delivered (%s); next in %.1fs", err, self.heartbeat_s)
            return
        if answer.lease_s > 0:
            self.lease_s = answer.lease_s
        self._renew_leases(now, running, set(answer.cancel_ids))
        for attempt_id in answer.cancel_ids:
            if self.state.known(attempt_id):
                atomic_write_text(
                    self.state.cancel_request(attempt_id), "the control plane no longer wants this attempt\n"
                )

    def _renew_leases(self, asked_at: datetime, running: Sequence[Running], cancel: set[str]) -> None:
        """Each attempt the scheduler renewed gets a new lease file, dated when the renewal
        was asked for (before the scheduler granted it, so the fence stays early); one it
        named to cancel is not renewed, so its runner stops even if the cancel is lost."""
        for r in running:
            if r.attempt_id in cancel:
                continue
            try:
                lease.renew(self.state.attempt(r.attempt_id), asked_at, self.lease_s)
            except OSError as err:  # the attempt ended and was filed away meanwhile
                log.debug("attempt %s: lease not renewed (%s)", r.attempt_id, err)


def take_worker_lock(state: StateDir) -> IO[str] | None:
    """Hold the machine's worker lock for this process's life; None if another worker has it.
    The kernel drops the lock when the holder dies, so a crash never leaves it stuck."""
    handle = open(state.worker_lock, "a")  # noqa: SIM115 - held open for the process's life
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def _launcher_or_none(settings: Settings) -> SlotLauncher | None:
    """The machine's launcher, for reclaiming slots; None when the walls cannot be built
    (the agent has then failed start-up loudly, and no job runs here)."""
    try:
        return build_launcher(settings)
    except WallsUnavailable as err:
        log.error("the walls cannot be built here (%s); slots of dead runners are not reclaimed", err)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpufleet.agent.worker")
    # Named on the command line so the agent recognises this machine's worker by its pid.
    parser.add_argument("--state-dir", type=Path)
    args = parser.parse_args(argv)
    settings = Settings()
    if args.state_dir is not None:
        settings.agent_state_dir = args.state_dir.absolute()
    settings.pin_clock_origin()
    transport = settings.start_process("agent-worker", "worker")
    state = StateDir(settings.agent_state_dir).ensure()
    lock = take_worker_lock(state)
    if lock is None:
        log.error("another worker already runs on %s; exiting", state.root)
        return 1
    atomic_write_text(state.worker_pid, f"{os.getpid()}\n")
    reports = GrpcSchedulerReports(
        settings.scheduler_address,
        settings.machine_id,
        settings.rpc_timeout_s,
        transport,
        gpu_health_file=health_file(state.root),
    )
    worker = Worker(
        state,
        settings.make_clock(),
        reports,
        PopenRunnerProcesses(settings.child_env(dict(os.environ))),
        heartbeat_s=settings.heartbeat_s,
        completion_retry_s=settings.completion_retry_s,
        launcher=_launcher_or_none(settings),
        checkpoint_send_per_tick_bytes=settings.checkpoint_send_per_tick_bytes,
        assumed_lease_s=settings.assumed_lease_s,
    )
    stop = threading.Event()
    stop_on_signals(stop)
    log.info("worker %d serving machine %s from %s", os.getpid(), settings.machine_id, state.root)
    worker.run_forever(stop, settings.poll_s)
    log.info("worker stopping; runners keep running and the next worker adopts them")
    if read_pid(state.worker_pid) == os.getpid():
        state.worker_pid.unlink(missing_ok=True)
    reports.close()
    lock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
