"""``python -m gpufleet.agent.runner <spec.json>``: one job, from start to verdict.

The runner is its own process so that a job outlives the agent and the worker: either
may restart and the runner carries on; the worker that comes back reads the verdict from
the attempt's folder. The runner starts the job from an argv list (the configured
pipeline command behind the slot launcher's prefix) — never a shell — and hands it its
spec as a file named in ``GPUFLEET_JOB_SPEC``, so tenant values stay data. It enforces
the attempt's time limit on the injected clock, obeys a cancel marker, and writes the
result (outcome, exit code, clock slot-seconds) atomically before it exits.

It also keeps the machine's side of the attempt's lease (gpufleet.agent.lease): a job
whose lease the worker has not renewed for half of the granted lease is stopped as our
failure (INFRA_ERROR), so it is gone before the control plane declares the attempt lost
and runs the job elsewhere — the runner needs nobody to tell it, since a dead, paused or
cut-off worker is exactly what cannot.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tarfile
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath

from gpufleet.agent import lease, platform_kills, slot_gpu_check
from gpufleet.agent.checkpoints import CheckpointError, Snapshots, restore_file, unpack
from gpufleet.agent.job_output import copy_output
from gpufleet.agent.launcher import OpenSlot, SlotError, SlotLauncher
from gpufleet.agent.redact import Redactor
from gpufleet.agent.settings import Settings
from gpufleet.agent.specs import AttemptResult, JobSpec, Outcome, iso
from gpufleet.agent.statedir import AttemptFiles, atomic_write_json, atomic_write_text
from gpufleet.agent.verdict import StopReason, decide_outcome, exit_code_of, is_disruption
from gpufleet.agent.walls import pipelines
from gpufleet.agent.walls.setup import WallsUnavailable, build_launcher
from gpufleet.agent.walls.wipe import remove_tree
from gpufleet.common import telemetry
from gpufleet.common.clock import Clock
from gpufleet.common.lease_fence import fenced_grace_cap_s, runner_fence_s
from gpufleet.common.signals import on_signals

# The job's tokens, one file per scope, inside its own folder (GPUFLEET_TOKENS_DIR).
TOKENS_FOLDER = "tokens"
# The job's checkpoint folder, inside its own folder (GPUFLEET_CHECKPOINT_DIR).
CHECKPOINT_FOLDER = "checkpoint"

log = logging.getLogger(__name__)


def job_base_environment(
    parent: Mapping[str, str], clock_env: Mapping[str, str], spec_path: Path, work_dir: Path
) -> dict[str, str]:
    """What the job inherits: the runner's environment without gpufleet's own settings
    (addresses, machine id), plus the clock and where its spec and folder are."""
    env = {k: v for k, v in parent.items() if not k.startswith("GPUFLEET_")}
    env.update(clock_env)
    env["GPUFLEET_JOB_SPEC"] = str(spec_path)
    env["GPUFLEET_JOB_DIR"] = str(work_dir)
    return env


class Runner:
    """Runs one attempt's job to its end and writes the verdict."""

    def __init__(
        self,
        files: AttemptFiles,
        spec: JobSpec,
        clock: Clock,
        launcher: SlotLauncher,
        pipeline_command: Sequence[str],
        clock_env: Mapping[str, str],
        *,
        poll_s: float,
        kill_grace_s: float,
        pipelines_root: Path,
        pipeline_source: Path | None = None,
        checkpoint_every_s: float = 60.0,
        checkpoint_max_bytes: int = 64 << 20,
        gpu_check: slot_gpu_check.GpuCheck = slot_gpu_check.no_check,
    ) -> None:
        self.gpu_check = gpu_check  # before the job: can the GPUs be initialised?
        self.checkpoint_every_s = checkpoint_every_s
        self.checkpoint_max_bytes = checkpoint_max_bytes
        self.files = files
        self.spec = spec
        self.clock = clock
        self.launcher = launcher
        self.pipeline_command = list(pipeline_command)
        self.clock_env = dict(clock_env)
        self.poll_s = poll_s
        self.kill_grace_s = kill_grace_s
        self.pipelines_root = pipelines_root
        self.pipeline_source = pipeline_source
        self.stop = threading.Event()
        self.signalled = False
        # The renewal whose fence stopped the job (None: the fence did not).
        self.fenced_by: lease.Renewal | None = None

    def on_signal(self, signum: int) -> None:
        log.warning("runner received %s; stopping the job", signal.Signals(signum).name)
        self.signalled = True
        self.stop.set()

    def run(self) -> AttemptResult:
        existing = AttemptResult.load(self.files.result)
        if existing is not None:  # started twice: the first verdict stands
            return existing
        start = self.clock.now()
        if (gpu_failure := self.gpu_check()) is not None:
            return self._finish(start, Outcome.INFRA_ERROR, 0, gpu_failure)
        try:
            pipeline_dir = pipelines.install(
                self.pipelines_root, self.spec.pipeline_version, self.pipeline_source
            )
        except pipelines.PipelineError as err:
            return self._finish(start, Outcome.INFRA_ERROR, 0, str(err))
        try:
            slot = self.launcher.open_slot(self.spec, self.files, pipeline_dir)
        except SlotError as err:
            log.error(
                "attempt %s: slot %d could not be closed: %s", self.spec.attempt_id, self.spec.slot, err
            )
            return self._finish(
                start, Outcome.INFRA_ERROR, 0, f"slot could not be closed off: {err}", slot_not_closed=True
            )
        try:
            return self._run_job(start, slot)
        finally:
            try:
                slot.close()
            except Exception:  # the verdict is written; a failed wipe must be seen, not fatal
                log.exception(
                    "slot %d could not be wiped after attempt %s", self.spec.slot, self.spec.attempt_id
                )

    def _checkpoint_folder(self, slot: OpenSlot) -> Snapshots | None:
        """A kind that resumes from checkpoints: the job's checkpoint folder, holding the
        checkpoint this attempt starts from (if its worker could read it)."""
        if not self.spec.keeps_checkpoint:
            return None
        folder = slot.job_dir / CHECKPOINT_FOLDER
        folder.mkdir(exist_ok=True)
        restore = restore_file(self.files)
        if restore.exists():
            try:
                n = unpack(restore, folder, self.checkpoint_max_bytes)
                log.info(
                    "attempt %s: starts from checkpoint %s (%d files)",
                    self.spec.attempt_id,
                    self.spec.checkpoint_id,
                    n,
                )
            except (CheckpointError, tarfile.TarError, OSError) as err:
                log.warning(
                    "attempt %s: checkpoint %s not restored (%s); the job starts from the beginning",
                    self.spec.attempt_id,
                    self.spec.checkpoint_id,
                    err,
                )
                remove_tree(folder)
                folder.mkdir()
        slot.give(folder)
        return Snapshots(self.files, folder, self.checkpoint_every_s, self.checkpoint_max_bytes)

    def _token_files(self, slot: OpenSlot) -> bool:
        """The attempt's tokens as files in the job's own folder (``tokens/model``,
        ``tokens/voice``), readable by its slot user only: never in its argv or
        environment, where another slot's ``/proc`` could read them."""
        if not self.spec.tokens:
            return False
        folder = slot.job_dir / TOKENS_FOLDER
        folder.mkdir(mode=0o700, exist_ok=True)
        for scope, token in self.spec.tokens.items():
            fd = os.open(folder / scope, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o400)
            with os.fdopen(fd, "w") as fh:
                fh.write(token)
        slot.give(folder)
        return True

    def _run_job(self, start: datetime, slot: OpenSlot) -> AttemptResult:
        argv = slot.command(self.pipeline_command)
        try:
            snapshots = self._checkpoint_folder(slot)
        except OSError as err:
            return self._finish(start, Outcome.INFRA_ERROR, 0, f"checkpoint folder not made: {err}")
        try:
            has_tokens = self._token_files(slot)
        except OSError as err:
            return self._finish(start, Outcome.INFRA_ERROR, 0, f"token files not written: {err}")
        env = slot.environment(
            job_base_environment(os.environ, self.clock_env, self.files.spec, slot.job_dir)
        )
        if has_tokens:
            env["GPUFLEET_TOKENS_DIR"] = str(PurePosixPath(env["GPUFLEET_JOB_DIR"]) / TOKENS_FOLDER)
        if snapshots is not None:
            env["GPUFLEET_CHECKPOINT_DIR"] = str(PurePosixPath(env["GPUFLEET_JOB_DIR"]) / CHECKPOINT_FOLDER)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                # A pipe, not the log file: the job holds no descriptor of the machine's
                # files, and its output passes through the runner on its way to the log.
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=slot.job_dir,
                # Its own process group (same session, so the machine's stop still reaches
                # it): ending the job ends everything it started, not just its first process.
                process_group=0,
                preexec_fn=slot.preexec(),
            )
        except OSError as err:
            return self._finish(start, Outcome.INFRA_ERROR, 0, f"could not start the job {argv[0]!r}: {err}")
        copier = threading.Thread(
            target=copy_output,
            args=(proc, self.files.job_log, Redactor(self.spec.tokens.values())),
            daemon=True,
        )
        copier.start()
        atomic_write_json(
            self.files.runner_state, {"pid": os.getpid(), "job_pid": proc.pid, "start_time": iso(start)}
        )
        log.info("attempt %s: job started as pid %d", self.spec.attempt_id, proc.pid)
        stopped: StopReason | None = None
        deadline = start + timedelta(seconds=self.spec.time_limit_s) if self.spec.time_limit_s > 0 else None
        while (returncode := proc.poll()) is None:
            stopped = self._stop_reason(deadline)
            if stopped is not None:
                returncode = self._terminate(proc, slot, self._grace_s(stopped))
                break
            if snapshots is not None:
                snapshots.maybe(self.clock.now().timestamp())
            self.stop.wait(self.poll_s)  # real time: how soon an exit or a marker is noticed
        # Nothing outlives the job: whatever it left behind goes with it.
        slot.signal(proc.pid, signal.SIGKILL)
        copier.join(timeout=5)
        if self.signalled:
            stopped = StopReason.RUNNER_STOPPED
        exit_code = exit_code_of(returncode)
        # Read after the job ended: a kill is recorded before it is sent.
        killed_by_platform = platform_kills.recorded_kill(self.files) if exit_code else ""
        outcome, message = decide_outcome(
            exit_code,
            stopped,
            self._cancel_reason(),
            killed_by_platform=killed_by_platform,
            out_of_memory=bool(exit_code) and slot.out_of_memory(),
            fence_message=self._fence_message(),
        )
        disrupted = is_disruption(outcome, stopped, killed_by_platform)
        return self._finish(start, outcome, exit_code, message, disrupted=disrupted)

    def _stop_reason(self, deadline: datetime | None) -> StopReason | None:
        if self.signalled:
            return StopReason.RUNNER_STOPPED
        if self.files.cancel.exists():
            return StopReason.CANCELLED
        now = self.clock.now()
        renewal = lease.read_renewal(self.files)
        if lease.fenced(now, renewal):
            self.fenced_by = renewal
            log.warning(
                "attempt %s: %s; stopping the job so that it never runs beside its retry",
                self.spec.attempt_id,
                self._fence_message(),
                extra={"fields": {"attempt_id": self.spec.attempt_id, "fence": "stop"}},
            )
            return StopReason.LEASE_FENCED
        if deadline is not None and now >= deadline:
            return StopReason.TIMED_OUT
        return None

    def _fence_message(self) -> str:
        renewal = self.fenced_by
        if renewal is None:
            return ""
        return (
            f"stopped by the machine's lease fence: the attempt's lease was last renewed at "
            f"{renewal.at.isoformat()} and not again for {runner_fence_s(renewal.lease_s):g} s "
            f"(half of the {renewal.lease_s:g} s lease); the control plane could not be reached "
            f"or this machine's worker was gone or paused"
        )

    def _grace_s(self, stopped: StopReason) -> float:
        """Real seconds between SIGTERM and SIGKILL: the configured grace, but a fenced job
        must be gone inside the lease's margin (gpufleet.common.lease_fence)."""
        if stopped is StopReason.LEASE_FENCED and self.fenced_by is not None:
            cap = self.clock.real_seconds(fenced_grace_cap_s(self.fenced_by.lease_s))
            return min(self.kill_grace_s, cap)
        return self.kill_grace_s

    def _cancel_reason(self) -> str:
        try:
            return self.files.cancel.read_text().strip()
        except FileNotFoundError:
            return ""

    def _terminate(self, proc: subprocess.Popen[bytes], slot: OpenSlot, grace_s: float) -> int:
        """SIGTERM to everything the job started, a grace period, then SIGKILL."""
        slot.signal(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            slot.signal(proc.pid, signal.SIGKILL)
            return proc.wait()

    def _finish(
        self,
        start: datetime,
        outcome: Outcome,
        exit_code: int,
        message: str,
        *,
        slot_not_closed: bool = False,
        disrupted: bool = False,
    ) -> AttemptResult:
        end = self.clock.now()
        # Measured for every outcome; whether it is charged is the scheduler's call.
        ran = max(0.0, (end - start).total_seconds())
        result = AttemptResult(
            attempt_id=self.spec.attempt_id,
            outcome=outcome,
            exit_code=exit_code,
            slot_seconds=ran * self.spec.slots,
            message=message,
            start_time=iso(start),
            end_time=iso(end),
            slot_not_closed=slot_not_closed,
            disrupted=disrupted,
        )
        result.save(self.files.result)
        log.info(
            "attempt %s ended %s (exit %d, %.1f slot-seconds) %s",
            self.spec.attempt_id,
            outcome.value,
            exit_code,
            result.slot_seconds,
            message,
        )
        return result


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m gpufleet.agent.runner <attempt folder>/spec.json", file=sys.stderr)
        return 2
    spec_path = Path(args[0]).resolve()
    settings = Settings()
    telemetry.configure("agent-runner", level=settings.log_level, log_format=settings.log_format)
    files = AttemptFiles(spec_path.parent)
    atomic_write_text(files.runner_pid, f"{os.getpid()}\n")
    spec = JobSpec.load(spec_path)
    clock = settings.make_clock()
    try:
        launcher = build_launcher(settings)
    except WallsUnavailable as err:
        now = iso(clock.now())
        AttemptResult(
            spec.attempt_id,
            Outcome.INFRA_ERROR,
            message=f"slot could not be closed off: {err}",
            start_time=now,
            end_time=now,
            slot_not_closed=True,
        ).save(files.result)
        return 0
    runner = Runner(
        files,
        spec,
        clock,
        launcher,
        settings.pipeline_command,
        settings.clock_env(),
        poll_s=settings.poll_s,
        kill_grace_s=settings.kill_grace_s,
        pipelines_root=settings.pipelines_root,
        pipeline_source=settings.pipeline_source,
        checkpoint_every_s=settings.checkpoint_every_s,
        checkpoint_max_bytes=settings.checkpoint_max_bytes,
    )
    runner.gpu_check = slot_gpu_check.from_settings(settings, clock, spec.attempt_id, runner.stop.wait)
    on_signals(runner.on_signal)
    runner.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
