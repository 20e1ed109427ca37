"""Boot failure: a machine that has not reported since it was (re)started, past its boot
window, is destroyed — once the failure is re-confirmed live (DESIGN §4, every 60 s).

Its question is "has it ever reported?", which no staleness check can ask: with no first
report to age, a machine that never came up looks the same on every tick. The boot
window is the ladder's grace gate, counted from ``first_observed_at`` (when this platform
first saw the machine running this time) and never from the provider's launch time: the
two differ by enough to kill a machine still pulling its image — whose replacement would
then also be pulling its image. An exempt workload class never reports by design, so it
is refused by class.

Before acting, the failure is re-confirmed live across two ticks through the agent's
``Probe``: the first tick that finds start-up not complete (or failed, or the agent
unreachable) records the sighting in ``startup_failed_at``; a later tick that finds it
still failing destroys. A probe that finds start-up healthy clears the sighting instead —
a slow start that finishes is never destroyed. One limit on that: an agent that keeps
saying start-up is complete while its worker never reports is treated as failing once
twice the boot window has passed. Probes run in parallel with no transaction open.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool
from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import RUNNING_STATES
from gpufleet.common.db.models import Machine
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, OutcomePolicy
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.reaper.agent_probe import AgentProber, StartupProbe, probe_all
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.detection_latency import boot_window_start
from gpufleet.reaper.lifetime import reported_this_life, unreported_this_life_sql
from gpufleet.reaper.net_runner import ClaimingNet
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, RefusalReason, Refuse, first_refusal
from gpufleet.reaper.snapshot import not_destroyed, ours, scan, state_in
from gpufleet.reaper.transition import Detection, MachineProvider, destroy_transition

NAME = "boot_failure"
DESTROY = destroy_transition(NAME)


@dataclass(frozen=True)
class BootFailurePolicy:
    window: timedelta = timedelta(minutes=30)

    @property
    def gates(self) -> NetGates:
        return NetGates(net=NAME, grace=self.window, reads_reports=True)


@dataclass(frozen=True)
class CheckStartup:
    """Every gate cleared: look at the machine's start-up live before acting."""

    machine_id: str


@dataclass(frozen=True)
class RecordStartupFailure:
    """First sighting: acted on only if a later tick sees it too."""

    at: datetime
    why: str

    @property
    def values(self) -> dict[str, datetime | None]:
        """The row's update (the net's compare-and-set and the simulator apply it)."""
        return {"startup_failed_at": self.at}


@dataclass(frozen=True)
class ClearStartupFailure:
    """Start-up turned out healthy: forget an earlier sighting."""

    @property
    def values(self) -> dict[str, datetime | None]:
        return {"startup_failed_at": None}


@dataclass(frozen=True)
class DestroyMachine:
    machine_id: str
    details: str


BootAction = Refuse | RecordStartupFailure | ClearStartupFailure | DestroyMachine


def gate(now: datetime, machine: MachineSnapshot, policy: BootFailurePolicy) -> CheckStartup | Refuse | None:
    """Whether this net may look at ``machine`` at all (nothing to do: None)."""
    if machine.state not in RUNNING_STATES or reported_this_life(machine):
        return None
    reason = first_refusal(now, machine, policy.gates)
    if reason is not None:
        return Refuse(reason)
    return CheckStartup(machine.machine_id)


def due_at(machine: MachineSnapshot, policy: BootFailurePolicy) -> datetime | None:
    """When the boot window of a machine that has not reported this life ends (its
    requeue-after: the first pass that may probe it rather than refuse it in the window).
    None for a machine that has reported, is not running, or was not yet observed."""
    observed = machine.first_observed_at
    if machine.state not in RUNNING_STATES or reported_this_life(machine) or observed is None:
        return None
    return observed + policy.window


def earlier_sighting(now: datetime, machine: MachineSnapshot) -> datetime | None:
    """A start-up failure seen on an earlier tick of this life, if any."""
    seen = machine.startup_failed_at
    if seen is None or seen >= now:
        return None
    if machine.first_observed_at is not None and seen < machine.first_observed_at:
        return None  # seen before the latest start: another life
    return seen


def failure_of(probe: StartupProbe | None) -> str | None:
    """Why start-up is not shown healthy, or None when it is."""
    if probe is None:
        return "the agent did not answer its probe"
    if probe.startup_error:
        return f"start-up failed: {probe.startup_error}"
    if not probe.startup_complete:
        return "start-up not complete"
    if not probe.worker_alive:
        return "start-up complete but the worker is not alive"
    return None


def _past_report_deadline(now: datetime, machine: MachineSnapshot, policy: BootFailurePolicy) -> bool:
    return machine.first_observed_at is not None and now - machine.first_observed_at >= 2 * policy.window


def decide(
    now: datetime, machine: MachineSnapshot, probe: StartupProbe | None, policy: BootFailurePolicy
) -> list[BootAction]:
    """What a live probe (None: unreachable) means for a machine past the gate."""
    gated = gate(now, machine, policy)
    if gated is None:
        return []
    if isinstance(gated, Refuse):
        return [gated]
    why = failure_of(probe)
    if why is None and _past_report_deadline(now, machine, policy):
        # An agent that says all is well while its worker never reports would otherwise be
        # refused forever, billing; the seed's question is "has it ever reported?".
        why = "start-up reports complete, but the worker has not reported in twice the boot window"
    if why is None:
        actions: list[BootAction] = [Refuse(RefusalReason.STARTUP_HEALTHY)]
        if machine.startup_failed_at is not None:
            actions.insert(0, ClearStartupFailure())
        return actions
    seen = earlier_sighting(now, machine)
    if seen is None:
        return [RecordStartupFailure(now, why)]
    observed = machine.first_observed_at.isoformat() if machine.first_observed_at else "?"
    return [
        DestroyMachine(
            machine.machine_id,
            f"never reported since first observed at {observed} (boot window "
            f"{int(policy.window.total_seconds())}s); re-confirmed: failing since {seen.isoformat()}, "
            f"still failing now ({why})",
        )
    ]


class BootFailure(ClaimingNet[BootFailurePolicy, MachineSnapshot]):
    """Not a :class:`~gpufleet.reaper.net_runner.OneStepNet`: a machine that clears the
    gates is probed before it is decided, and a first failing probe is only recorded
    (re-confirmed on a later pass), so only the constructor and the pass are shared."""

    name = NAME

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        clock: Clock,
        provider: MachineProvider,
        prober: AgentProber,
        policy: BootFailurePolicy,
        outcomes: OutcomePolicy | None = None,
        concurrency: int = 16,
        *,
        calls: CallPool | None = None,
        instruments: Instruments = PROCESS,
    ) -> None:
        super().__init__(
            sessions, lease, clock, provider, policy, outcomes, calls=calls, instruments=instruments
        )
        self.prober = prober
        self.concurrency = concurrency

    def domain(self) -> list[ColumnElement[bool]]:
        # ix_machines_running_unreported: only machines that have not reported this life.
        return [state_in(RUNNING_STATES), unreported_this_life_sql()]

    def scan(self, now: datetime) -> list[MachineSnapshot]:
        """The running machines that have not reported this life (``now`` unused: the boot
        window is a gate, so a refusal inside it is counted)."""
        with self.sessions() as session:
            return scan(session, self.domain())

    def act(self, now: datetime, machines: Sequence[MachineSnapshot], decisions: DecisionLog) -> None:
        """Gate, probe the machines that cleared every gate (in parallel), decide, apply."""
        to_check: list[MachineSnapshot] = []
        for machine in machines:
            gated = gate(now, machine, self.policy)
            if isinstance(gated, Refuse):
                decisions.refused(machine.machine_id, gated.reason)
            elif isinstance(gated, CheckStartup):
                to_check.append(machine)
        probes = probe_all(self.prober, [(m.machine_id, m.agent_address) for m in to_check], self.concurrency)
        for machine, probe in zip(to_check, probes, strict=True):
            self.apply(now, machine, decide(now, machine, probe, self.policy), decisions)

    def apply(
        self, now: datetime, machine: MachineSnapshot, actions: Sequence[BootAction], decisions: DecisionLog
    ) -> None:
        mid = machine.machine_id
        for action in actions:
            if isinstance(action, Refuse):
                decisions.refused(mid, action.reason)
            elif isinstance(action, RecordStartupFailure):
                if self._set_sighting(machine, action.values):
                    decisions.acted(mid, "startup_failure_seen", action.why)
            elif isinstance(action, ClearStartupFailure):
                if self._set_sighting(machine, action.values):
                    decisions.acted(mid, "startup_failure_cleared")
            else:
                self.runner.execute(
                    DESTROY,
                    machine,
                    now,
                    decisions,
                    guards=[
                        *self.domain(),
                        Machine.startup_failed_at == machine.startup_failed_at,
                    ],
                    clear_at_end=[Machine.stop_due_at, Machine.destroy_due_at],
                    call=self.provider.destroy,
                    detection=Detection(FailureClass.BOOT_FAILED, action.details),
                    first_sign=boot_window_start(machine),
                )

    def _set_sighting(self, machine: MachineSnapshot, values: dict[str, datetime | None]) -> bool:
        """Compare-and-set ``startup_failed_at`` on what the scan saw (fenced)."""
        before = machine.startup_failed_at
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            result = session.execute(
                update(Machine)
                .where(
                    Machine.id == machine.machine_id,
                    Machine.state == machine.state,
                    not_destroyed(),
                    *ours(),
                    Machine.startup_failed_at.is_(None)
                    if before is None
                    else Machine.startup_failed_at == before,
                )
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            return bool(getattr(result, "rowcount", 0) == 1)
