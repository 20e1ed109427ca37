"""What one fleet tick's snapshot says about the fleet and its money, for the gauges and the
GPU-seconds counters. Pure: computed from the snapshot the tick already read, in one pass
over its machines, with no query of its own.

- **billing**: a machine in :data:`~gpufleet.common.lifecycle.BILLING_STATES` (the one
  owner of which states a cloud bills) counts its GPUs, and its price an hour toward the
  spend rate; it is **idle** when no live attempt (starting or running) is on any of its
  slots — billed, doing nothing for anyone.
- **slots**: a READY machine's slots, busy when the tick would not give them out (a live
  attempt holds them, or an ended one whose process the machine has not reported gone),
  free otherwise.
- **films**: a machine held for a film (``earmarked_for``) in a state that can hold one;
  ``draining`` while it is DRAINING for it, ``earmarked`` otherwise.
- **warm**: a machine its pool pins warm (``warm_held``) while it is running.
- **fair share**: the slot-seconds each workspace used over the window, summed by plan tier.

Every pool, place and tier the catalogue names is reported, zero when empty, so that a
dashboard's series do not come and go with the last machine of a kind.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from gpufleet.common.db.enums import MachineState
from gpufleet.common.lifecycle import BILLING_STATES
from gpufleet.scheduler.tick.films import HOLDING
from gpufleet.scheduler.tick.model import FleetSnapshot
from gpufleet.scheduler.tick.warm import LIVE as WARM_LIVE

# The pool label of a machine in no pool (a self-registered box not yet placed).
NO_POOL = "none"
SLOT_STATES = ("free", "busy")
FILM_STATES = ("earmarked", "draining")
_HOLDS_FILM = frozenset(s.value for s in HOLDING)
# As the snapshot spells states (plain strings: a lookup without the enum's comparison).
_BILLING = frozenset(s.value for s in BILLING_STATES)
_WARM = frozenset(WARM_LIVE)
_READY = MachineState.READY.value
_DRAINING = MachineState.DRAINING.value

Place = tuple[str, str]  # (provider, pool)


@dataclass(frozen=True)
class FleetFigures:
    """The gauges' values from one snapshot (each key names its labels' values)."""

    # (provider, pool) -> US dollars an hour the billing machines cost.
    spend: dict[Place, float]
    # (provider, pool) -> (GPUs billing, GPUs billing with no live attempt).
    gpus: dict[Place, tuple[int, int]]
    # (pool, free | busy) -> slots of READY machines.
    slots: dict[tuple[str, str], int]
    # (pool, earmarked | draining) -> machines held for films.
    films: dict[tuple[str, str], int]
    # pool -> machines held warm.
    warm: dict[str, int]
    # plan tier -> slot-seconds used over the fair-share window.
    fair_share: dict[str, float]


def fleet_figures(snapshot: FleetSnapshot) -> FleetFigures:
    pools = set(snapshot.pools)
    places = {(o.provider, o.pool_id) for o in snapshot.offerings}
    running = {a.machine_id for a in snapshot.live_attempts}
    spend_micros: Counter[Place] = Counter()
    billing: Counter[Place] = Counter()
    idle: Counter[Place] = Counter()
    slots: Counter[tuple[str, str]] = Counter()
    films: Counter[tuple[str, str]] = Counter()
    warm: Counter[str] = Counter()
    for m in snapshot.machines:
        pool = m.pool_id or NO_POOL
        if m.state in _BILLING:
            place = (m.provider, pool)
            places.add(place)
            spend_micros[place] += m.hourly_price_micros
            billing[place] += m.gpu_count
            if m.id not in running:
                idle[place] += m.gpu_count
        if m.state == _READY:
            pools.add(pool)
            busy = min(len(m.busy_slots), m.slots)
            slots[(pool, "busy")] += busy
            slots[(pool, "free")] += m.slots - busy
        if m.earmarked_for is not None and m.state in _HOLDS_FILM:
            pools.add(pool)
            films[(pool, "draining" if m.state == _DRAINING else "earmarked")] += 1
        if m.warm_held and m.state in _WARM:
            pools.add(pool)
            warm[pool] += 1
    pools.update(pool for _, pool in places)
    tiers = snapshot.workspace_tiers
    fair_share = {str(tier): 0.0 for tier in set(tiers.values())}
    for workspace, used in snapshot.usage_per_workspace.items():
        tier = tiers.get(workspace)
        if tier is not None:
            fair_share[str(tier)] += used
    return FleetFigures(
        spend={place: spend_micros[place] / 1_000_000 for place in places},
        gpus={place: (billing[place], idle[place]) for place in places},
        slots={(pool, state): slots[(pool, state)] for pool in pools for state in SLOT_STATES},
        films={(pool, state): films[(pool, state)] for pool in pools for state in FILM_STATES},
        warm={pool: warm[pool] for pool in pools},
        fair_share=fair_share,
    )


class GpuMeter:
    """GPU-seconds billed and idle, integrated from one fleet tick to the next.

    Each tick books, for every billing machine of its snapshot, its GPUs times the clock
    time since the previous tick's snapshot (the snapshot's ``now``, the injected clock's).
    Nothing is booked on the first tick of a leadership (no previous tick of this epoch:
    the time before it was the previous leader's to count), and a gap is booked at most
    ``max_gap_s`` (a few tick intervals): a leader that was paused or stuck did not see
    what the fleet did meanwhile, and booking the whole gap at the fleet it sees on waking
    would put hours into one scrape interval.
    """

    def __init__(self, max_gap_s: float) -> None:
        self.max_gap_s = max_gap_s
        self._last: tuple[int | None, datetime] | None = None

    def measure(
        self, now: datetime, epoch: int | None, gpus: dict[Place, tuple[int, int]]
    ) -> dict[Place, tuple[float, float]]:
        """(GPU-seconds billed, GPU-seconds idle) per (provider, pool) since the last tick."""
        last, self._last = self._last, (epoch, now)
        if last is None or last[0] != epoch:
            return {}
        seconds = min((now - last[1]).total_seconds(), self.max_gap_s)
        if seconds <= 0:
            return {}
        return {place: (billed * seconds, idle * seconds) for place, (billed, idle) in gpus.items() if billed}
