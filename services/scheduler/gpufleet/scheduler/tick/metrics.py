"""What the fleet tick tells an operator: how long each phase took, what it assigned, what
started (and how long it had waited) and what could not, the machines it saw, the money
they cost and the work waiting for them.

Everything here is fed from what the tick already read or did, with one exception: the
queue's depth, one grouped query off the tick's path (:mod:`.queue_depth` says why), which
also gives the plan caps' gauges each workspace's jobs that could start (:mod:`.plan_caps`).
The gauges are read from the last snapshot, and only while that snapshot is fresh (three
ticks): a replica that lost the lease stops ticking, and so stops reporting within three
ticks, leaving the leader's figures the only ones. The GPU-seconds counters are booked by
each tick of a leadership (:class:`~.fleet_figures.GpuMeter`), so replicas never book the
same seconds twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime

from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import MachineState
from gpufleet.common.job_outcomes import JobOutcomes
from gpufleet.common.metrics.catalog import (
    FLEET_FILM_MACHINES,
    FLEET_GPU_BILLED,
    FLEET_GPU_IDLE,
    FLEET_MACHINES,
    FLEET_SLOTS,
    FLEET_SPEND_RATE,
    FLEET_WARM_MACHINES,
    JOBS_STARTED,
    SCHEDULER_ASSIGNMENTS,
    SCHEDULER_DISPATCH_DURATION,
    SCHEDULER_DISPATCH_FAILURES,
    SCHEDULER_FAIR_SHARE_USAGE,
    SCHEDULER_PLAN_CAP_HELD_JOBS,
    SCHEDULER_PLAN_CAP_RUNNING_JOBS,
    SCHEDULER_PLAN_CAP_WORKSPACES_AT_CAP,
    SCHEDULER_QUEUE_JOBS,
    SCHEDULER_QUEUE_WAIT,
    SCHEDULER_TICK_PHASE_DURATION,
)
from gpufleet.common.metrics.instruments import Instruments, Observing
from gpufleet.scheduler.tick.dispatch_failure import DispatchFailure
from gpufleet.scheduler.tick.fleet_figures import NO_POOL, FleetFigures, GpuMeter, fleet_figures
from gpufleet.scheduler.tick.idle_timers import IdleTimerClears
from gpufleet.scheduler.tick.model import FleetSnapshot
from gpufleet.scheduler.tick.plan_caps import PlanCapFigures
from gpufleet.scheduler.tick.queue_depth import QueueKey

# Every state a snapshot's machine can be in: each is reported, zero when empty, so a
# dashboard's series do not come and go as the last machine of a state leaves it.
_STATES = tuple(s.value for s in MachineState if s is not MachineState.DESTROYED)

MachineKey = tuple[str, str, str]  # (state, pool, provider)
Observed = Iterator[tuple[float, Mapping[str, str]]]


@dataclass(frozen=True)
class Assigned:
    """What the start metrics need of an attempt, known when its assignment was committed."""

    kind: str
    # The assignment's commit (the attempt's ``started_at``).
    assigned_at: datetime
    # Its workspace's plan tier, and when its job began this wait (its submission, or its
    # requeue); None for an attempt re-dispatched by a later leader, whose commit read
    # neither: its wait is not measured, its dispatch is.
    plan_tier: str | None = None
    queued_since: datetime | None = None


def machines_by_state(snapshot: FleetSnapshot) -> dict[MachineKey, int]:
    """The snapshot's machines counted by state, pool and provider, with a zero for each
    state of every (pool, provider) the catalogue's offerings or the machines name."""
    counts: Counter[MachineKey] = Counter()
    places = {(o.pool_id, o.provider) for o in snapshot.offerings}
    for m in snapshot.machines:
        pool = m.pool_id or NO_POOL
        places.add((pool, m.provider))
        counts[(m.state, pool, m.provider)] += 1
    for pool, provider in places:
        for state in _STATES:
            counts[(state, pool, provider)] += 0
    return dict(counts)


class TickMetrics:
    """The fleet tick's instruments; ``close()`` stops its gauges."""

    def __init__(self, instruments: Instruments, clock: Clock, fresh_s: float) -> None:
        self.clock = clock
        self.fresh_s = fresh_s
        self._phases = instruments.histogram(SCHEDULER_TICK_PHASE_DURATION)
        self._assignments = instruments.counter(SCHEDULER_ASSIGNMENTS)
        self._started = instruments.counter(JOBS_STARTED)
        self._queue_wait = instruments.histogram(SCHEDULER_QUEUE_WAIT)
        self._dispatch = instruments.histogram(SCHEDULER_DISPATCH_DURATION)
        self._failures = instruments.counter(SCHEDULER_DISPATCH_FAILURES)
        self._billed = instruments.counter(FLEET_GPU_BILLED)
        self._idle = instruments.counter(FLEET_GPU_IDLE)
        # Jobs finished, retried and attempts lost by the tick's own writes.
        self.jobs = JobOutcomes(instruments)
        # Idle timers taken off by the tick's assignments and starts.
        self.idle_timers = IdleTimerClears(instruments)
        # A gap between two ticks is booked up to the same three ticks the gauges stay
        # fresh for (see GpuMeter).
        self.gpu_meter = GpuMeter(max_gap_s=fresh_s)
        # (the snapshot's time, its machines by state, pool and provider, its figures):
        # replaced whole by the tick, read whole by the metrics reader's thread.
        self._seen: tuple[datetime, dict[MachineKey, int], FleetFigures] | None = None
        # (the count's tick time, the queue by kind and tier, the plan caps' figures).
        self._queue: tuple[datetime, dict[QueueKey, int], PlanCapFigures | None] | None = None
        self._observing: list[Observing] = [
            instruments.observe(metric, source)
            for metric, source in (
                (FLEET_MACHINES, self._machines),
                (FLEET_SPEND_RATE, self._spend),
                (FLEET_SLOTS, self._slots),
                (FLEET_FILM_MACHINES, self._films),
                (FLEET_WARM_MACHINES, self._warm),
                (SCHEDULER_FAIR_SHARE_USAGE, self._fair_share),
                (SCHEDULER_QUEUE_JOBS, self._queued),
                (SCHEDULER_PLAN_CAP_HELD_JOBS, self._held_by_cap),
                (SCHEDULER_PLAN_CAP_WORKSPACES_AT_CAP, self._at_cap),
                (SCHEDULER_PLAN_CAP_RUNNING_JOBS, self._running_by_tier),
            )
        ]

    # -- from the tick --------------------------------------------------------------------
    def saw(self, snapshot: FleetSnapshot, epoch: int | None = None) -> None:
        """The snapshot a tick of leadership ``epoch`` just read: the gauges' figures, and
        the GPU-seconds its machines billed since the previous tick."""
        figures = fleet_figures(snapshot)
        self._seen = (snapshot.now, machines_by_state(snapshot), figures)
        for (provider, pool), (billed, idle) in self.gpu_meter.measure(
            snapshot.now, epoch, figures.gpus
        ).items():
            labels = {"provider": provider, "pool": pool}
            self._billed.add(billed, labels)
            self._idle.add(idle, labels)

    def counted_queue(
        self, at: datetime, counts: dict[QueueKey, int], caps: PlanCapFigures | None = None
    ) -> None:
        """The queue's count for the tick at ``at``: its depth by kind and tier, and the plan
        caps' figures made from it (None: not made, their gauges say nothing)."""
        self._queue = (at, counts, caps)

    def ticked(self, phases: Mapping[str, float]) -> None:
        for phase, seconds in phases.items():
            self._phases.record(seconds, {"phase": phase})

    def assigned(self, machine_ids: Iterable[str], snapshot: FleetSnapshot) -> None:
        """Assignments committed, counted by their machine's pool (from the snapshot the
        tick decided on)."""
        per_machine = Counter(machine_ids)
        if not per_machine:
            return
        pool_of = {m.id: m.pool_id for m in snapshot.machines if m.id in per_machine}
        per_pool: Counter[str] = Counter()
        for machine_id, n in per_machine.items():
            per_pool[pool_of.get(machine_id) or NO_POOL] += n
        for pool, n in per_pool.items():
            self._assignments.add(n, {"pool": pool})

    def started(self, attempts: Iterable[Assigned], now: datetime) -> None:
        """Attempts recorded RUNNING at ``now``: counted by kind, their dispatch (from the
        assignment's commit) and their wait in the queue (from submission or requeue)."""
        kinds: Counter[str] = Counter()
        for a in attempts:
            kinds[a.kind] += 1
            self._dispatch.record(max(0.0, (now - a.assigned_at).total_seconds()))
            if a.queued_since is not None and a.plan_tier is not None:
                waited = max(0.0, (now - a.queued_since).total_seconds())
                self._queue_wait.record(waited, {"kind": a.kind, "plan_tier": a.plan_tier})
        for kind, n in kinds.items():
            self._started.add(n, {"kind": kind})

    def dispatch_failed(self, cause: DispatchFailure, attempts: int) -> None:
        if attempts:
            self._failures.add(attempts, {"cause": cause.value})

    # -- to the metrics reader ------------------------------------------------------------
    def _fresh(self, at: datetime) -> bool:
        # Not ticking (not the leader any more, or stuck): leave the figure to the one that is.
        return (self.clock.now() - at).total_seconds() <= self.fresh_s

    def _figures(self) -> FleetFigures | None:
        seen = self._seen
        return seen[2] if seen is not None and self._fresh(seen[0]) else None

    def _machines(self) -> Observed:
        seen = self._seen
        if seen is None or not self._fresh(seen[0]):
            return
        for (state, pool, provider), n in seen[1].items():
            yield n, {"state": state, "pool": pool, "provider": provider}

    def _spend(self) -> Observed:
        if (f := self._figures()) is not None:
            for (provider, pool), dollars in f.spend.items():
                yield dollars, {"provider": provider, "pool": pool}

    def _slots(self) -> Observed:
        if (f := self._figures()) is not None:
            for (pool, state), n in f.slots.items():
                yield n, {"pool": pool, "slot_state": state}

    def _films(self) -> Observed:
        if (f := self._figures()) is not None:
            for (pool, state), n in f.films.items():
                yield n, {"pool": pool, "film_state": state}

    def _warm(self) -> Observed:
        if (f := self._figures()) is not None:
            for pool, n in f.warm.items():
                yield n, {"pool": pool}

    def _fair_share(self) -> Observed:
        if (f := self._figures()) is not None:
            for tier, used in f.fair_share.items():
                yield used, {"plan_tier": tier}

    def _queued(self) -> Observed:
        queue = self._queue
        if queue is None or not self._fresh(queue[0]):
            return
        for (kind, tier), n in queue[1].items():
            yield n, {"kind": kind, "plan_tier": tier}

    def _caps(self) -> PlanCapFigures | None:
        queue = self._queue
        return queue[2] if queue is not None and self._fresh(queue[0]) else None

    def _held_by_cap(self) -> Observed:
        if (c := self._caps()) is not None:
            for tier, n in c.held.items():
                yield n, {"plan_tier": tier}

    def _at_cap(self) -> Observed:
        if (c := self._caps()) is not None:
            for tier, n in c.at_cap.items():
                yield n, {"plan_tier": tier}

    def _running_by_tier(self) -> Observed:
        if (c := self._caps()) is not None:
            for tier, n in c.running.items():
                yield n, {"plan_tier": tier}

    def close(self) -> None:
        for observing in self._observing:
            observing.close()
