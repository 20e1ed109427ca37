"""The fleet tick: one snapshot, one pure decision, then five small controllers.

``run(now)`` never waits on a network call. It reads the snapshot, decides
(:func:`~gpufleet.scheduler.tick.decide.decide`), and applies the plan as database writes
only: leases and limits (:class:`LimitsController`), the scale step's intent
(:class:`ScaleController`), the films' drains and released earmarks
(:class:`EarmarkController`), the pools' idle clocks and warm pins (:class:`PoolController`),
the assign step's one-transaction commit
(:class:`DispatchController`), which also records why each job left waiting waits when that
changed (:mod:`~gpufleet.scheduler.tick.pending`). Provider calls and agent calls go to two bounded
pools (:class:`CallPool`) — one for the clouds (create, start), one for the agents (StartJob,
CancelJob) — and are recorded when they answer; what they did is counted in the next
tick's report. So a slow or hung cloud delays only its own machine and never a dispatch,
and lease expiry, time limits and assignment happen every tick.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.calls import CallPool, Outcomes
from gpufleet.common.clients.agent import AgentClient, AgentClients
from gpufleet.common.clients.provisioner import ProvisionerClient
from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import MachineState
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.common.telemetry import tracer
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.boot_times import BootTimes
from gpufleet.scheduler.tick.decide import decide
from gpufleet.scheduler.tick.dispatch import DispatchController
from gpufleet.scheduler.tick.earmarks import EarmarkController
from gpufleet.scheduler.tick.limits import LimitsController
from gpufleet.scheduler.tick.metrics import TickMetrics
from gpufleet.scheduler.tick.model import Assignment, FleetSnapshot, MachineView
from gpufleet.scheduler.tick.plan_caps import plan_cap_figures
from gpufleet.scheduler.tick.pools import PoolController
from gpufleet.scheduler.tick.queue_depth import queued_jobs
from gpufleet.scheduler.tick.scale import ScaleController
from gpufleet.scheduler.tick.served import ServedOfferings
from gpufleet.scheduler.tick.snapshot import LiveAttempts, load_snapshot

_tracer = tracer("gpufleet.scheduler")
log = logging.getLogger(__name__)


class _Phases:
    """Times each phase of one tick (wall seconds) under a span of its own name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        with _tracer.start_as_current_span(f"fleet_tick.{name}"):
            yield
        self.seconds[name] = time.perf_counter() - t0


class FleetTick:
    """One leader's fleet tick; ``run(now)`` is called by the Ticker every ``tick_s``."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        clock: Clock,
        lease: LeaderLease,
        provisioner: ProvisionerClient,
        settings: Settings,
        agent_factory: Callable[[str, str], AgentClient] | None = None,
        served: ServedOfferings | None = None,
        instruments: Instruments = PROCESS,
    ) -> None:
        if agent_factory is None:
            transport = settings.transport("scheduler")

            def agent_factory(machine_id: str, address: str) -> AgentClient:
                return AgentClient(machine_id, address, transport)

        self.sessions = sessions
        self.lease = lease
        self.served = served or ServedOfferings()
        self.settings = settings
        self.policy = settings.tick_policy()
        # Separate capacity: a create takes 30-60 s at a cloud, a StartJob milliseconds; in one
        # pool, twenty slow creates held every worker and no job started on the machines
        # already there.
        self.provider_calls = CallPool(settings.provider_call_workers, "provider-calls")
        self.dispatch_calls = CallPool(settings.dispatch_workers, "dispatch-calls")
        self.agents = AgentClients(agent_factory)
        self.outcomes = Outcomes()
        outcomes = self.outcomes
        # The machines gauge goes quiet three ticks after the last one (a deposed leader).
        self.metrics = TickMetrics(instruments, clock, fresh_s=3 * settings.tick_s)
        self.scale = ScaleController(
            sessions,
            clock,
            lease,
            provisioner,
            settings,
            self.provider_calls,
            outcomes,
            self.metrics.idle_timers,
        )
        self.dispatch = DispatchController(
            sessions, clock, lease, settings, self.dispatch_calls, self.agents, outcomes, self.metrics
        )
        self.limits = LimitsController(sessions, lease, settings, self.dispatch, self.metrics.jobs)
        self.earmarks = EarmarkController(sessions, lease)
        self.pools = PoolController(sessions, lease)
        # The live attempts' views, kept from tick to tick (only what changed is read).
        self.live_attempts = LiveAttempts()
        # The machines' boots as this leader saw them (a waiting job's expected ready time).
        self.boot_times = BootTimes()
        # The last tick's phases, wall seconds each (snapshot, decide, limits, ...).
        self.last_phases: dict[str, float] = {}

    def run(self, now: datetime) -> TickReport:
        report = TickReport()
        self.outcomes.drain_into(report)
        phases = _Phases()
        with phases("snapshot"), self.sessions() as session:
            snapshot = load_snapshot(
                session,
                now,
                self.settings.fair_share_window_s,
                self.live_attempts,
                self.policy.deadline_near_share,
            )
        self.boot_times.saw(snapshot.machines)
        snapshot = dataclasses.replace(
            snapshot,
            served_offerings=self.served.get(),
            arriving_since=self.boot_times.arriving_since(),
            typical_boot_s=self.boot_times.typical_s(),
        )
        # The gauges and the GPU-seconds billed, from what the tick just read.
        self.metrics.saw(snapshot, self.lease.epoch)
        with phases("connect"):
            self._connect_ahead(snapshot.machines)
        with phases("decide"):
            plan = decide(snapshot, self.policy)
        with phases("limits"):
            self.limits.apply(plan.expired_leases, plan.over_limit, now, report)
        with phases("films"):
            self.earmarks.apply(plan.drains, plan.releases, now, report)
            report.refusals.update(plan.film_waits)
        with phases("pools"):
            self.pools.apply(plan.pool_clocks, plan.warm_pins, now, report)
        with phases("scale"):
            self.scale.record(plan.scale, now, report)
        with phases("assign"):
            committed = self.dispatch.commit(
                plan.assignments, now, report, _tiers(plan.assignments, snapshot), plan.pending
            )
        with phases("follow_up"):
            self.dispatch.take_back_overdue(now, report)
            self.scale.adopt(report)
            self.dispatch.adopt(now, report)
        self.last_phases = phases.seconds
        # From what the tick read and did, no query of its own.
        self.metrics.assigned(committed, snapshot)
        self.metrics.ticked(phases.seconds)
        # The queue's depth and the plan caps' figures, off the tick's path (at most one
        # count in flight).
        running = _running_after(plan.assignments, snapshot)
        self.dispatch_calls.submit("count-queue", lambda: self._count_queue(now, snapshot, running))
        return report

    def _count_queue(self, now: datetime, snapshot: FleetSnapshot, running: dict[str, int]) -> None:
        """The queue's depth and the plan caps' figures for their gauges: the one query made
        for a metric (the snapshot reads only the jobs a tick can act on; see queue_depth),
        run by a task of the dispatch pool in a session of its own — about 10 ms at 10k
        queued jobs in 200 workspaces, 65 ms at 100k in 1,000 (36 ms there grouped by kind
        and tier alone, before the plan caps; PostgreSQL on a busy 2-core machine), none of
        it on the tick's path or in its transactions. A failure costs the figures (they go
        stale), never the tick. ``running``: each workspace's live attempts after this
        tick's assignments, which the count (read after their commit) no longer finds
        queued; the caps and tiers are the snapshot's."""
        try:
            with self.sessions() as session:
                count = queued_jobs(session, now)
        except Exception:
            log.warning("the queue's depth was not counted this tick", exc_info=True)
            return
        caps = plan_cap_figures(
            count.startable, running, snapshot.workspace_limits, snapshot.workspace_tiers, count.tiers
        )
        self.metrics.counted_queue(now, count.by_kind, caps)

    def _connect_ahead(self, machines: Sequence[MachineView]) -> None:
        """Connections to the agents of machines that may take work, opened ahead of their
        first dispatch by a task of the dispatch pool (the handshakes run in gRPC's own
        threads; nothing in the tick waits on them); those of destroyed machines closed."""
        # The snapshot holds every machine not destroyed: a client of any other is closed.
        self.agents.retain({(m.id, m.agent_address) for m in machines if m.agent_address})
        new = [
            (m.id, m.agent_address)
            for m in machines
            if m.state == MachineState.READY.value
            and m.agent_address
            and not m.lost
            and not self.agents.has(m.id, m.agent_address)
        ]
        if new:

            def connect() -> None:
                for machine_id, address in new:
                    self.agents.connect(machine_id, address)

            self.dispatch_calls.submit("connect-agents", connect)

    def settle(self, timeout_s: float = 60.0) -> TickReport:
        """Wait for every call in flight and return what they did (tests, shutdown)."""
        self.dispatch_calls.wait_idle(timeout_s)
        self.provider_calls.wait_idle(timeout_s)
        self.dispatch_calls.wait_idle(timeout_s)  # cancels a late provider answer asked for
        report = TickReport()
        self.outcomes.drain_into(report)
        return report

    def close(self) -> None:
        self.metrics.close()
        self.provider_calls.close()
        self.dispatch_calls.close()
        self.agents.close()


def _running_after(assignments: Sequence[Assignment], snapshot: FleetSnapshot) -> dict[str, int]:
    """Each workspace's live attempts once the tick's assignments are committed: the
    snapshot's, and one more per job assigned (an assignment its commit found stale is
    counted until the next tick). No query: the plan cap gauges' running side."""
    running = dict(snapshot.running_per_workspace)
    if assignments:
        wanted = {a.job_id for a in assignments}
        for job in snapshot.queued:
            if job.id in wanted:
                running[job.workspace_id] = running.get(job.workspace_id, 0) + 1
    return running


def _tiers(assignments: Sequence[Assignment], snapshot: FleetSnapshot) -> dict[str, int]:
    """Each assigned job's plan tier, from the snapshot it was decided on (for the queue
    wait's label, so the commit reads no plan)."""
    if not assignments:
        return {}
    wanted = {a.job_id for a in assignments}
    return {j.id: j.tier for j in snapshot.queued if j.id in wanted}
