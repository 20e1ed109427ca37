"""Films beside shorts: earmarks, drains and the share cap (seed 001, "Films need a whole
machine"). Pure, like the rest of the tick's decision.

A film needs every slot of one machine. Shorts pack busy machines first, so a wholly free
machine is often there; when none is, the film **earmarks** a machine: the cheapest
stopped one is started for it (or one is created), and no short may take it. When no
machine may start (the pool's or the fleet's ceiling), the ready machine whose jobs are
expected to end soonest **drains** (``DRAINING``): it takes no new job, its running jobs
finish — a running job is never cut off — and the film starts there.

While shorts wait in a pool, films hold at most ``film_share`` of its live machines,
rounded down: shorts feed posting slots and a film is not time-critical. A machine counts
as held by films while it runs a film or is earmarked for one. With no short waiting there
is no cap, so a pool of one machine still runs a film.

An earmark that no longer serves its film is released at once: the film was cancelled,
failed, paused or started elsewhere (the assign commit clears it then), or the machine
left the running states. A released DRAINING machine is ready again.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from gpufleet.common.db.enums import MachineState
from gpufleet.scheduler.tick.model import (
    AttemptView,
    Drain,
    FleetSnapshot,
    JobView,
    MachineView,
    Policy,
    Release,
)

S = MachineState
# States in which a machine can hold an earmark, best first (the one kept when a film
# somehow holds two).
HOLDING = (S.READY, S.DRAINING, S.BOOTING, S.STARTING, S.PROVISIONING)
_RANK = {s.value: i for i, s in enumerate(HOLDING)}
# Machines that count toward a pool's film-capable machines.
_LIVE = frozenset(s.value for s in HOLDING)

# Why a film got nothing this tick.
WAIT_SHARE_CAP = "film_share_cap"
WAIT_NO_MACHINE = "film_no_machine"
WAIT_EARMARK = "film_waits_for_its_machine"


def stale_earmarks(snapshot: FleetSnapshot, demand: list[JobView]) -> list[Release]:
    """Earmarks that no longer serve a film: its film is not among the jobs that may run
    now, or the machine left the states that can take it (stopped, destroyed, lost,
    cordoned), or the film holds a better machine already."""
    films = {j.id for j in demand if j.whole_machine}
    marked = sorted(
        (m for m in snapshot.machines if m.earmarked_for is not None),
        key=lambda m: (_RANK.get(m.state, len(HOLDING)), m.id),
    )
    kept: set[str] = set()
    out: list[Release] = []
    for m in marked:
        job = m.earmarked_for
        assert job is not None
        if job not in films:
            why = "the film is no longer waiting to run"
        elif m.state not in _LIVE or m.lost or m.cordoned:
            why = f"the machine is {'lost' if m.lost else 'cordoned' if m.cordoned else m.state}"
        elif job in kept:
            why = "the film holds another machine"
        else:
            kept.add(job)
            continue
        out.append(Release(machine_id=m.id, job_id=job, why=why))
    return out


@dataclass
class FilmBook:
    """The films' hold on each pool while one tick is decided; updated as films are given
    machines, earmarks and drains, so the cap holds within the tick too."""

    share: float
    # film job id -> the machine earmarked for it (released earmarks left out).
    earmark_of: dict[str, MachineView]
    # pool -> machines held by films (running one, or earmarked).
    held: Counter[str]
    # pool -> live machines (the film-capable machines the share is of).
    live: Counter[str]
    # Pools where a short job waits.
    shorts_waiting: frozenset[str]
    # The tick's live attempts and clock: when each machine's running jobs are expected to
    # end is read from them only if a drain is chosen (:meth:`ends_at`).
    attempts: list[AttemptView]
    now: datetime
    drains: list[Drain] = field(default_factory=list)
    waits: Counter[str] = field(default_factory=Counter)
    _ends_at: dict[str, datetime] | None = None

    def ends_at(self, machine_id: str) -> datetime:
        """When the machine's running jobs are expected to end (now if it runs none)."""
        if self._ends_at is None:
            ends: dict[str, datetime] = {}
            for a in self.attempts:
                end = max(a.expected_end, self.now)
                ends[a.machine_id] = max(ends.get(a.machine_id, end), end)
            self._ends_at = ends
        return self._ends_at.get(machine_id, self.now)

    @property
    def earmarked(self) -> frozenset[str]:
        return frozenset(m.id for m in self.earmark_of.values()) | {d.machine_id for d in self.drains}

    def cap(self, pool_id: str, adds_machine: bool) -> int | None:
        """How many machines films may hold in the pool (None: no cap, no short waits)."""
        if pool_id not in self.shorts_waiting:
            return None
        return math.floor(self.share * (self.live[pool_id] + (1 if adds_machine else 0)))

    def may_hold_one_more(self, pool_id: str, adds_machine: bool) -> bool:
        cap = self.cap(pool_id, adds_machine)
        return cap is None or self.held[pool_id] + 1 <= cap

    def hold(self, pool_id: str, adds_machine: bool) -> None:
        self.held[pool_id] += 1
        if adds_machine:
            self.live[pool_id] += 1


def film_book(
    snapshot: FleetSnapshot, policy: Policy, demand: list[JobView], releases: list[Release]
) -> FilmBook:
    released = {r.machine_id for r in releases}
    earmark_of: dict[str, MachineView] = {}
    held: Counter[str] = Counter()
    live: Counter[str] = Counter()
    counts: dict[str, int] = {}
    for m in snapshot.machines:
        pool = m.pool_id
        if pool is None or m.state not in _LIVE or m.lost:
            continue
        counts[pool] = counts.get(pool, 0) + 1
        if m.earmarked_for is not None and m.id not in released:
            earmark_of[m.earmarked_for] = m
            held[pool] += 1
    live.update(counts)
    # The machines films run on matter only to a film that waits: with none in the
    # demand, the tick skips the pass over every live attempt.
    if any(j.whole_machine for j in demand):
        pool_of = {m.id: m.pool_id for m in snapshot.machines}
        for a in snapshot.live_attempts:
            if a.whole_machine and (pool := pool_of.get(a.machine_id)) is not None:
                held[pool] += 1
    return FilmBook(
        share=policy.film_share,
        earmark_of=earmark_of,
        held=held,
        live=live,
        shorts_waiting=frozenset(j.pool_id for j in demand if not j.whole_machine),
        attempts=snapshot.live_attempts,
        now=snapshot.now,
    )


def choose_drain(candidates: list[MachineView], book: FilmBook, now: datetime) -> MachineView | None:
    """The machine whose running jobs are expected to end soonest (by their kinds'
    expected durations from their start), then the cheapest, then by id. Only machines
    with work are candidates: a wholly free one is given to the film directly."""
    busy = [m for m in candidates if m.busy_slots and m.id not in book.earmarked]
    if not busy:
        return None
    return min(busy, key=lambda m: (book.ends_at(m.id), m.hourly_price_micros, m.id))
