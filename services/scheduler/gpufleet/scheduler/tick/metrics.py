"""What the fleet tick tells an operator: how long each phase took, what it assigned, what
started and what could not, and the machines it saw.

Everything here is fed from what the tick already read or did: no query and no call is
made for a metric. The machines gauge is read from the last snapshot, and only while that
snapshot is fresh (three ticks): a replica that lost the lease stops ticking, and so stops
reporting within three ticks, leaving the leader's figure the only one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime

from gpufleet.common.clock import Clock
from gpufleet.common.db.enums import MachineState
from gpufleet.common.metrics.catalog import (
    FLEET_MACHINES,
    JOBS_STARTED,
    SCHEDULER_ASSIGNMENTS,
    SCHEDULER_DISPATCH_FAILURES,
    SCHEDULER_TICK_PHASE_DURATION,
)
from gpufleet.common.metrics.instruments import Instruments
from gpufleet.scheduler.tick.dispatch_failure import DispatchFailure
from gpufleet.scheduler.tick.model import FleetSnapshot

# The pool label of a machine in no pool (a self-registered box not yet placed).
NO_POOL = "none"
# Every state a snapshot's machine can be in: each is reported, zero when empty, so a
# dashboard's series do not come and go as the last machine of a state leaves it.
_STATES = tuple(s.value for s in MachineState if s is not MachineState.DESTROYED)

MachineKey = tuple[str, str, str]  # (state, pool, provider)


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
    """The fleet tick's instruments; ``close()`` stops its machines gauge."""

    def __init__(self, instruments: Instruments, clock: Clock, fresh_s: float) -> None:
        self.clock = clock
        self.fresh_s = fresh_s
        self._phases = instruments.histogram(SCHEDULER_TICK_PHASE_DURATION)
        self._assignments = instruments.counter(SCHEDULER_ASSIGNMENTS)
        self._started = instruments.counter(JOBS_STARTED)
        self._failures = instruments.counter(SCHEDULER_DISPATCH_FAILURES)
        # (the snapshot's time, its machines by state, pool and provider): replaced whole
        # by the tick, read whole by the metrics reader's thread.
        self._seen: tuple[datetime, dict[MachineKey, int]] | None = None
        self._observing = instruments.observe(FLEET_MACHINES, self._machines)

    def saw(self, snapshot: FleetSnapshot) -> None:
        self._seen = (snapshot.now, machines_by_state(snapshot))

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

    def started(self, kinds: Iterable[str]) -> None:
        for kind, n in Counter(kinds).items():
            self._started.add(n, {"kind": kind})

    def dispatch_failed(self, cause: DispatchFailure, attempts: int) -> None:
        if attempts:
            self._failures.add(attempts, {"cause": cause.value})

    def _machines(self) -> Iterator[tuple[float, Mapping[str, str]]]:
        seen = self._seen
        if seen is None:
            return
        at, counts = seen
        if (self.clock.now() - at).total_seconds() > self.fresh_s:
            return  # not ticking (not the leader any more): leave the figure to the one that is
        for (state, pool, provider), n in counts.items():
            yield n, {"state": state, "pool": pool, "provider": provider}

    def close(self) -> None:
        self._observing.close()
