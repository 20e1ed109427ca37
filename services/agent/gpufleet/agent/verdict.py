"""How an attempt ended, in words the scheduler records: the runner's verdict from the
job's exit and from why the runner stopped it (if it did). Pure, so it is tested by table
(tests/unit/agent/test_runner.py)."""

from __future__ import annotations

import signal
from enum import Enum

from gpufleet.agent.specs import Outcome


class StopReason(Enum):
    """Why the runner stopped the job before it ended by itself."""

    CANCELLED = "cancelled"
    TIMED_OUT = "timed out"
    LEASE_FENCED = "lease not renewed"
    RUNNER_STOPPED = "runner stopped"


def decide_outcome(
    exit_code: int,
    stopped: StopReason | None,
    cancel_reason: str = "",
    *,
    killed_by_platform: str = "",
    out_of_memory: bool = False,
    fence_message: str = "",
) -> tuple[Outcome, str]:
    """The outcome of an attempt from how its job ended; pure, so it is tested by table.

    A runner that was itself told to stop (the machine is stopping) reports INFRA_ERROR
    even when the job's exit is seen first: the job died of the same signal. So does a job
    that failed after the platform said it would kill it (``killed_by_platform``, read from
    :mod:`gpufleet.agent.platform_kills`): ours, never charged nor counted against the
    job's retry budget. So does a job stopped by its lease's fence (``fence_message``
    says for how long nobody renewed it). Every other failure — its own signal, its own exit code, the kernel
    killing it at its memory limit — is the job's.
    """
    if stopped is StopReason.RUNNER_STOPPED:
        return Outcome.INFRA_ERROR, "the runner was stopped (machine stopping or agent shutdown)"
    if stopped is StopReason.LEASE_FENCED:
        return Outcome.INFRA_ERROR, fence_message or "stopped by the lease fence: the lease was not renewed"
    if stopped is StopReason.CANCELLED:
        return Outcome.CANCELLED, f"cancelled: {cancel_reason}" if cancel_reason else "cancelled"
    if stopped is StopReason.TIMED_OUT:
        return Outcome.TIMED_OUT, "stopped at the attempt's time limit"
    if exit_code == 0:
        return Outcome.SUCCEEDED, ""
    if killed_by_platform:
        return Outcome.INFRA_ERROR, f"killed by the platform ({killed_by_platform}), exit {exit_code}"
    if exit_code > 128:
        name = _signal_name(exit_code - 128)
        if out_of_memory:
            return Outcome.FAILED, f"the job was killed by {name} at its memory limit (out of memory)"
        return Outcome.FAILED, f"the job was killed by {name}"
    return Outcome.FAILED, f"the job exited with code {exit_code}"


def is_disruption(outcome: Outcome, stopped: StopReason | None, killed_by_platform: str = "") -> bool:
    """Whether an INFRA_ERROR is one the platform knows its own reason for, so the job
    cannot have caused it: the lease fence, the runner told to stop (the machine stopping),
    a kill the agent announced. The scheduler then spends no retry of the job's
    (:mod:`gpufleet.common.job_lifecycle`). (A runner that died without a verdict is one
    too, said by the worker that finds it.) A pipeline missing on the machine is not: it
    would fail the same way on every machine."""
    if outcome is not Outcome.INFRA_ERROR:
        return False
    return stopped in (StopReason.LEASE_FENCED, StopReason.RUNNER_STOPPED) or bool(killed_by_platform)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_code_of(returncode: int) -> int:
    """Popen's ``-N`` (killed by signal N) as the shell's ``128 + N``."""
    return 128 - returncode if returncode < 0 else returncode
