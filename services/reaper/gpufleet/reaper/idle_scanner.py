"""The idle scanner: the head of the money chain (DESIGN §4, every 30 s).

For each running, managed machine we provisioned, ask its agent for a short live sample.
Quiet arms ``stop_due_at`` and ``destroy_due_at`` together — only when neither is armed,
so later quiet samples never push them out, and stop always falls due before destroy.
Traffic clears both **unconditionally**: the clearing write has no condition on the
recorded state, because a gate on that path can only fail dangerous — a machine that
drifted into a state nobody anticipated would keep serving live traffic with a destroy
timer counting down against it. An agent that cannot be reached gives no sample and
changes no timer (fails safe).

Which machines are sampled follows from that: every machine of ours (not destroyed, with
an agent address) that is running (BOOTING/READY/DRAINING) **or has a timer armed, whatever
its recorded state** — a scan limited to running states would be the very state gate the
clearing path must not have. Only a machine that has come up for work (READY or
DRAINING) is ever armed: a BOOTING machine is quiet because it is still pulling its
image, and whether it ever comes up is the provision-deadline and boot-failure nets'
question, on their own windows — arming it would let the money chain stop a slow boot
before the boot window has run out.

Every contact also writes the probe liveness channel (``probe_ok_at`` /
``probe_failed_since``) that the lost detector reads; a failed contact is recorded only
for a running machine (a stopped one is expected not to answer).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from sqlalchemy import Update, func, literal, or_, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import idle_timers
from gpufleet.common.clients.agent import AgentClient, AgentClients
from gpufleet.common.db.enums import RUNNING_STATES, MachineState
from gpufleet.common.db.models import Machine, UTCDateTime
from gpufleet.common.errors import GpufleetError
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.catalog import REAPER_IDLE_TIMERS
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.trust.transport import Transport
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.refusal import MachineSnapshot
from gpufleet.reaper.snapshot import not_destroyed, ours, scan

log = logging.getLogger(__name__)

NAME = "idle_scanner"
_RUNNING = sorted(s.value for s in RUNNING_STATES)
# Up for work: the only states a quiet sample may arm.
ARMABLE_STATES = frozenset({MachineState.READY, MachineState.DRAINING})
_ARMABLE = sorted(s.value for s in ARMABLE_STATES)


@dataclass(frozen=True)
class UtilisationSample:
    """What an agent saw over its short sampling window."""

    gpu_utilization_percent: float
    running_attempts: int
    requests_since_last_sample: int
    # NVENC, NVDEC and memory traffic: a video job's encode-bound phase can read ~0 % GPU.
    encoder_utilization_percent: float = 0.0
    decoder_utilization_percent: float = 0.0
    memory_utilization_percent: float = 0.0


@dataclass(frozen=True)
class IdlePolicy:
    stop_after: timedelta = timedelta(minutes=5)
    destroy_after: timedelta = timedelta(hours=2)
    # At or above this GPU utilisation the machine counts as busy.
    gpu_busy_percent: float = 5.0
    # At or above this encoder, decoder or memory utilisation it counts as busy too: a
    # small floor, since an idle GPU reads 0 on each and any real use is traffic.
    engine_busy_percent: float = 1.0


@dataclass(frozen=True)
class ArmIdleTimers:
    stop_due_at: datetime
    destroy_due_at: datetime

    @property
    def values(self) -> Mapping[str, datetime | None]:
        """The row's update (the scanner's gated write and the simulator apply it)."""
        return {"stop_due_at": self.stop_due_at, "destroy_due_at": self.destroy_due_at}


@dataclass(frozen=True)
class ClearIdleTimers:
    """Traffic was seen: both timers go, whatever the row says."""

    @property
    def values(self) -> Mapping[str, datetime | None]:
        return idle_timers.CLEARED


@dataclass(frozen=True)
class ProbeSucceeded:
    at: datetime


@dataclass(frozen=True)
class ProbeFailed:
    at: datetime


IdleAction = ArmIdleTimers | ClearIdleTimers | ProbeSucceeded | ProbeFailed


def is_quiet(machine: MachineSnapshot, sample: UtilisationSample, policy: IdlePolicy) -> bool:
    """Quiet = no running attempt (agent's or ours), no request, GPU under the threshold,
    and the encoder, decoder and memory each under the engine floor.

    A live attempt recorded here counts as traffic even before the agent has started it:
    work has been assigned, so the machine is not idle.
    """
    return (
        sample.running_attempts == 0
        and machine.live_attempts == 0
        and sample.requests_since_last_sample == 0
        and sample.gpu_utilization_percent < policy.gpu_busy_percent
        and sample.encoder_utilization_percent < policy.engine_busy_percent
        and sample.decoder_utilization_percent < policy.engine_busy_percent
        and sample.memory_utilization_percent < policy.engine_busy_percent
    )


def decide(
    now: datetime, machine: MachineSnapshot, sample: UtilisationSample | None, policy: IdlePolicy
) -> list[IdleAction]:
    """What one sample (or its absence) means for one machine's timers and probe channel."""
    if sample is None:
        # No sample, no timer change (fails safe).
        return [ProbeFailed(now)] if machine.state in RUNNING_STATES else []
    actions: list[IdleAction] = [ProbeSucceeded(now)]
    if not is_quiet(machine, sample, policy):
        # No condition on state, managed or whether anything is armed: traffic clears.
        actions.append(ClearIdleTimers())
    elif machine.state in ARMABLE_STATES and machine.stop_due_at is None and machine.destroy_due_at is None:
        actions.append(ArmIdleTimers(now + policy.stop_after, now + policy.destroy_after))
    return actions


class AgentSampler(Protocol):
    def sample(self, machine_id: str, address: str) -> UtilisationSample | None:
        """A live sample of the machine's agent at ``address`` (only that machine may
        answer), or None when the agent cannot be reached or answer in time."""
        ...


class GrpcAgentSampler:
    """Samples an agent over gRPC through :class:`AgentClient` (a deadline on every call)."""

    def __init__(
        self, transport: Transport, window: timedelta = timedelta(seconds=2), timeout_s: float = 5.0
    ) -> None:
        self.window = window
        self.timeout_s = timeout_s
        # One channel per agent, reused pass after pass.
        self.clients = AgentClients(
            lambda machine_id, address: AgentClient(machine_id, address, transport, timeout_s=timeout_s)
        )

    def sample(self, machine_id: str, address: str) -> UtilisationSample | None:
        try:
            resp = self.clients.get(machine_id, address).sample(self.window)
        except GpufleetError as err:
            log.info("agent %s gave no sample: %s", address, err)
            return None
        except Exception:
            log.exception("unexpected error sampling agent %s", address)
            return None
        return UtilisationSample(
            gpu_utilization_percent=resp.gpu_utilization_percent,
            running_attempts=resp.running_attempts,
            requests_since_last_sample=resp.requests_since_last_sample,
            encoder_utilization_percent=resp.encoder_utilization_percent,
            decoder_utilization_percent=resp.decoder_utilization_percent,
            memory_utilization_percent=resp.memory_utilization_percent,
        )


class IdleScanner:
    """Scan (one query), sample every agent in parallel with no transaction open, apply.

    A pass never waits on its slowest machine: it waits at most ``pass_deadline_s`` for the
    samples, and a machine whose sample has not come back by then counts as unreachable for
    this pass (no sample: no timer change, as for any agent that cannot answer). Its call
    goes on in the background and the machine is not sampled again until it returns, so
    one frozen agent holds one worker, never the money chain for the whole fleet."""

    name = NAME

    def __init__(
        self,
        sessions: sessionmaker[Session],
        lease: LeaderLease,
        sampler: AgentSampler,
        policy: IdlePolicy,
        concurrency: int = 16,
        pass_deadline_s: float = 10.0,
        *,
        instruments: Instruments = PROCESS,
    ) -> None:
        self.sessions = sessions
        self.lease = lease
        self.sampler = sampler
        self.policy = policy
        self.instruments = instruments
        self._timers = instruments.counter(REAPER_IDLE_TIMERS)
        self.concurrency = max(1, concurrency)
        self.pass_deadline_s = pass_deadline_s
        self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="idle-sample")
        self._lock = threading.Lock()
        self._in_flight: set[str] = set()
        self._unanswered: set[str] = set()

    def scan(self) -> list[MachineSnapshot]:
        with self.sessions() as session:
            return scan(
                session,
                [
                    *ours(),
                    Machine.agent_address.is_not(None),
                    or_(
                        Machine.state.in_(_RUNNING),
                        Machine.stop_due_at.is_not(None),
                        Machine.destroy_due_at.is_not(None),
                    ),
                ],
                # It samples agents and decides on timers alone: no provider call, and
                # none of the lifecycle or liveness fields.
                with_offering=False,
                with_lifecycle=False,
            )

    def run(self, now: datetime) -> TickReport:
        decisions = DecisionLog(NAME, instruments=self.instruments)
        machines = self.scan()
        if not machines:
            return decisions.report
        samples = self._sample_all(machines, decisions)
        for machine, sample in zip(machines, samples, strict=True):
            self.apply(machine, decide(now, machine, sample, self.policy), decisions)
        return decisions.report

    def _sample_all(
        self, machines: Sequence[MachineSnapshot], decisions: DecisionLog
    ) -> list[UtilisationSample | None]:
        futures: dict[str, Future[UtilisationSample | None]] = {}
        # Machines that answered last time go first: frozen agents queue behind the fleet,
        # never the fleet behind them.
        order = sorted(machines, key=lambda m: m.machine_id in self._unanswered)
        for m in order:
            with self._lock:
                busy = m.machine_id in self._in_flight
                if not busy:
                    self._in_flight.add(m.machine_id)
            if busy:  # its last sample has not come back: unreachable again this pass
                decisions.acted(m.machine_id, "sample_still_running")
                continue
            future = self._pool.submit(self.sampler.sample, m.machine_id, m.agent_address or "")
            future.add_done_callback(functools.partial(self._returned, m.machine_id))
            futures[m.machine_id] = future
        wait(list(futures.values()), timeout=self.pass_deadline_s)
        samples: list[UtilisationSample | None] = []
        for m in machines:
            f = futures.get(m.machine_id)
            sample = f.result() if f is not None and f.done() and f.exception() is None else None
            if f is not None and not f.done():
                decisions.acted(m.machine_id, "sample_past_pass_deadline")
            if sample is None:
                self._unanswered.add(m.machine_id)
            else:
                self._unanswered.discard(m.machine_id)
            samples.append(sample)
        return samples

    def _returned(self, machine_id: str, _future: object = None) -> None:
        with self._lock:
            self._in_flight.discard(machine_id)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def apply(self, machine: MachineSnapshot, actions: Sequence[IdleAction], decisions: DecisionLog) -> None:
        """One fenced transaction per machine, so one bad row cannot block another's clearing.

        The idle timers' counter (``armed`` / ``cleared``) is added to once that transaction
        has committed: a fenced or failed write armed or cleared nothing."""
        if not actions:
            return
        mid = machine.machine_id
        timers: list[str] = []
        with self.sessions() as session, session.begin():
            self.lease.fence(session)
            for action in actions:
                if isinstance(action, ClearIdleTimers):
                    # Written whether or not the scan saw anything armed (no gate); counted
                    # as a "clear" only when it disarmed something, so the count means that.
                    session.execute(clear_idle_timers(mid))
                    if machine.stop_due_at is not None or machine.destroy_due_at is not None:
                        decisions.acted(mid, "clear")
                        timers.append("cleared")
                    else:
                        decisions.acted(mid, "traffic", level=logging.DEBUG)
                elif isinstance(action, ArmIdleTimers):
                    if arm_idle_timers(session, mid, action):
                        timers.append("armed")
                        decisions.acted(
                            mid,
                            "arm",
                            f"stop at {action.stop_due_at.isoformat()}, "
                            f"destroy at {action.destroy_due_at.isoformat()}",
                        )
                elif isinstance(action, ProbeSucceeded):
                    _probe_ok(session, mid, action.at)
                    decisions.acted(mid, "probe_ok", level=logging.DEBUG)
                else:
                    _probe_failed(session, mid, action.at)
                    decisions.acted(mid, "probe_failed")
        for what in timers:
            self._timers.add(1, {"action": what})


def clear_idle_timers(machine_id: str) -> Update:
    """``UPDATE machines SET stop_due_at=NULL, destroy_due_at=NULL WHERE id=:id`` — no other condition.

    Deliberately no state, managed or origin condition: traffic clears both timers
    whatever the recorded state says (seed: "the clearing step has no gate"). It is a
    statement, not a call, so a test can read its WHERE clause.
    """
    return (
        update(Machine)
        .where(Machine.id == machine_id)
        .values(**idle_timers.CLEARED)
        .execution_options(synchronize_session=False)
    )


def arm_idle_timers(session: Session, machine_id: str, arm: ArmIdleTimers) -> bool:
    """Arm both timers only if neither is armed and the machine is still up for work and ours.

    Unlike clearing, arming is gated: if the row moved since the scan, arming fails safe.
    """
    result = session.execute(
        update(Machine)
        .where(
            Machine.id == machine_id,
            Machine.stop_due_at.is_(None),
            Machine.destroy_due_at.is_(None),
            Machine.state.in_(_ARMABLE),
            not_destroyed(),
            *ours(),
        )
        .values(**arm.values)
        .execution_options(synchronize_session=False)
    )
    return bool(getattr(result, "rowcount", 0) == 1)


def _probe_ok(session: Session, machine_id: str, at: datetime) -> None:
    # The agent answered: this platform has seen the machine running. first_observed_at
    # is filled only once (the grace windows count from it, never from the provider).
    session.execute(
        update(Machine)
        .where(Machine.id == machine_id, Machine.managed.is_(True), not_destroyed())
        .values(
            probe_ok_at=at,
            probe_failed_since=None,
            first_observed_at=func.coalesce(Machine.first_observed_at, literal(at, UTCDateTime())),
        )
        .execution_options(synchronize_session=False)
    )


def _probe_failed(session: Session, machine_id: str, at: datetime) -> None:
    session.execute(
        update(Machine)
        .where(
            Machine.id == machine_id,
            Machine.managed.is_(True),
            not_destroyed(),
            Machine.probe_failed_since.is_(None),
        )
        .values(probe_failed_since=at)
        .execution_options(synchronize_session=False)
    )
