"""A pool's warm capacity and its idle clock. Pure, like the rest of the tick's decision.

A pool with a ``warm_target`` keeps that many machines running while it has work, so a
job starts on a booted machine: the scale step tops the pool up to it, and the tick pins
that many of its running machines (``warm_held``; the cheapest, then by id) so the money
chain does not stop them for being quiet between jobs. The pool's idle clock
(``idle_since``) starts when it has neither queued work nor a live attempt and stops when
work comes back. Once it has run for the pool's ``idle_release_after_s``, the pool idle
release watchdog releases the warm capacity (``warm_released``): the pins go, and the
money chain stops the quiet machines as it would any other. Work coming back holds the
warm capacity again. Nothing here touches a machine with work: a pin only keeps a
machine, and a machine with work is never stopped anyway.
"""

from __future__ import annotations

from datetime import datetime
from typing import TypedDict

from gpufleet.common.db.enums import MachineOrigin, MachineState
from gpufleet.scheduler.tick.model import FleetSnapshot, MachineView, PoolClock, PoolView, WarmPin

# Machines that count as (or are on their way to being) a pool's running capacity.
LIVE = frozenset(
    s.value
    for s in (
        MachineState.PROVISIONING,
        MachineState.STARTING,
        MachineState.BOOTING,
        MachineState.READY,
        MachineState.DRAINING,
    )
)


def busy_pools(snapshot: FleetSnapshot) -> frozenset[str]:
    """The snapshot's pools with queued work or a live attempt on one of their machines."""
    busy = {j.pool_id for j in snapshot.queued}
    if not busy.issuperset(snapshot.pools):  # every pool has queued work: no attempt changes that
        pool_of = {m.id: m.pool_id for m in snapshot.machines}
        busy.update(p for a in snapshot.live_attempts if (p := pool_of.get(a.machine_id)) is not None)
    return frozenset(busy.intersection(snapshot.pools))


def pool_clocks(snapshot: FleetSnapshot, busy: frozenset[str]) -> list[PoolClock]:
    """Only the pools whose clock moves this tick."""
    out: list[PoolClock] = []
    for pool in sorted(snapshot.pools.values(), key=lambda p: p.id):
        if pool.id in busy:
            if pool.idle_since is not None or pool.warm_released:
                out.append(PoolClock(pool.id, busy=True))
        elif pool.idle_since is None:
            out.append(PoolClock(pool.id, busy=False))
    return out


class PoolClockValues(TypedDict, total=False):
    idle_since: datetime | None
    warm_released: bool


def clock_values(clock: PoolClock, now: datetime) -> PoolClockValues:
    """The pool's columns a moved idle clock writes: work back stops the clock and holds
    the warm capacity again; no work left starts it. The one update the tick's pool writes
    (:class:`~gpufleet.scheduler.tick.pools.PoolController`) and the simulator apply."""
    if clock.busy:
        return {"idle_since": None, "warm_released": False}
    return {"idle_since": now}


def holds_warm(pool: PoolView, busy: frozenset[str]) -> bool:
    return pool.warm_target > 0 and (not pool.warm_released or pool.id in busy)


def warm_machines(snapshot: FleetSnapshot, pool: PoolView) -> list[MachineView]:
    """The machines that hold the pool's warm capacity: its cheapest running ones."""
    running = sorted(
        (
            m
            for m in snapshot.machines
            if m.pool_id == pool.id
            and m.state in LIVE
            and m.managed
            and m.origin == MachineOrigin.PROVISIONED
            and not m.lost
            and not m.cordoned
        ),
        key=lambda m: (m.hourly_price_micros, m.id),
    )
    return running[: pool.warm_target]


def warm_pins(snapshot: FleetSnapshot, busy: frozenset[str]) -> list[WarmPin]:
    """Pins to set or clear so that exactly the warm machines of each holding pool are pinned."""
    wanted: set[str] = set()
    for pool in snapshot.pools.values():
        if holds_warm(pool, busy):
            wanted.update(m.id for m in warm_machines(snapshot, pool))
    if wanted:
        changed = [m for m in snapshot.machines if m.warm_held != (m.id in wanted)]
    else:  # no pool holds warm machines: only pins left over are to clear
        changed = [m for m in snapshot.machines if m.warm_held]
    return [WarmPin(m.id, held=m.id in wanted) for m in sorted(changed, key=lambda m: m.id)]


def warm_missing(snapshot: FleetSnapshot, busy: frozenset[str]) -> dict[str, int]:
    """Per holding pool, how many machines short of its warm target it is."""
    out: dict[str, int] = {}
    for pool in snapshot.pools.values():
        if not holds_warm(pool, busy):
            continue
        # A cordoned machine (a GPU fault) is no warm capacity: its replacement is asked for now.
        have = sum(
            1
            for m in snapshot.machines
            if m.pool_id == pool.id and m.state in LIVE and not m.lost and not m.cordoned
        )
        if have < pool.warm_target:
            out[pool.id] = pool.warm_target - have
    return out
