"""Pure decisions of the fleet tick: no database, no network, no clock but ``snapshot.now``."""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from datetime import datetime, timedelta

from gpufleet.common.db.enums import MachineIntent, MachineOrigin, MachineState
from gpufleet.common.lifecycle import BILLING_STATES
from gpufleet.scheduler.tick.capacity import FreeCapacity
from gpufleet.scheduler.tick.films import (
    WAIT_EARMARK,
    WAIT_NO_MACHINE,
    WAIT_SHARE_CAP,
    FilmBook,
    choose_drain,
    film_book,
    stale_earmarks,
)
from gpufleet.scheduler.tick.model import (
    Assignment,
    AttemptView,
    CreateMachine,
    Drain,
    FleetSnapshot,
    JobView,
    MachineView,
    OfferingView,
    Pending,
    Policy,
    PoolView,
    ScaleCandidate,
    StartMachine,
    TickPlan,
)
from gpufleet.scheduler.tick.pending import (
    Why,
    boot_s,
    changes,
    expected_ready,
    films_share_cap,
    fleet_at_ceiling,
    held_back,
    held_for_it,
    no_usable_offering,
    plan_limit,
    pool_at_ceiling,
    ready_after,
    waiting_for_capacity,
    waiting_for_drain,
)
from gpufleet.scheduler.tick.warm import busy_pools, pool_clocks, warm_missing, warm_pins

ARRIVING = frozenset({MachineState.PROVISIONING, MachineState.BOOTING, MachineState.STARTING})


def decide(snapshot: FleetSnapshot, policy: Policy) -> TickPlan:
    """The whole tick's plan from one snapshot. Each step that leaves a queued job waiting
    says why as it decides it (``why``); the plan carries the reasons that changed."""
    why: Why = {}
    demand = eligible_demand(snapshot, why)
    releases = stale_earmarks(snapshot, demand)
    book = film_book(snapshot, policy, demand, releases)
    assignments = assign(snapshot, policy, demand, book)
    assigned = {a.job_id for a in assignments}
    unmet = [j for j in demand if j.id not in assigned]
    busy = busy_pools(snapshot)
    expired, over_limit = _attempts_to_end(snapshot.live_attempts, snapshot.now)
    actions = scale(snapshot, policy, unmet, book, warm_missing(snapshot, busy), why)
    for job in snapshot.held_back:
        why[job.id] = held_back(job, snapshot, policy)
    return TickPlan(
        scale=actions,
        assignments=assignments,
        expired_leases=expired,
        over_limit=over_limit,
        drains=book.drains,
        releases=releases,
        film_waits=book.waits,
        pool_clocks=pool_clocks(snapshot, busy),
        warm_pins=warm_pins(snapshot, busy),
        pending=changes([*snapshot.queued, *snapshot.held_back], why, assigned, snapshot, policy),
    )


def eligible_demand(snapshot: FleetSnapshot, why: Why | None = None) -> list[JobView]:
    """Queued jobs that may run now, in the order free slots go to them: plan tier (higher
    first), then fair share (slot-seconds over the window / plan weight, least first), then
    age — each workspace capped at its plan's number of GPU jobs at once (a job left out
    for it waits for PLAN_CONCURRENCY_LIMIT, in ``why``)."""
    ordered = sorted(snapshot.queued, key=lambda j: (-j.tier, j.usage / j.weight, j.created_at, j.id))
    running, limits = snapshot.running_per_workspace, snapshot.workspace_limits
    # Jobs taken here per workspace: the snapshot's own count (every workspace with a live
    # attempt) is read, not copied.
    taken: dict[str, int] = {}
    out: list[JobView] = []
    capped: dict[str, Pending] = {}  # one reason per workspace, shared by its jobs
    for job in ordered:
        ws = job.workspace_id
        now_taken = taken.get(ws, 0)
        if running.get(ws, 0) + now_taken >= limits.get(ws, 0):
            if why is not None:
                if (reason := capped.get(ws)) is None:
                    reason = capped[ws] = plan_limit(ws, limits.get(ws, 0))
                why[job.id] = reason
            continue
        taken[ws] = now_taken + 1
        out.append(job)
    return out


def queued_read_bound(limit: int) -> int:
    """How many of one workspace's oldest queued jobs a tick needs to see: ``eligible_demand``
    takes at most its plan's cap of them, and within one workspace jobs compare by age
    alone (tier, weight and fair-share usage are the workspace's), so the oldest ``limit``
    are the only ones it can take; one job still marks its pool as having work. The
    snapshot reads no more (a free tenant with 100k queued jobs costs every tick what two
    cost), and the simulator reads the same rows."""
    return max(limit, 1)


READY_ONLY = frozenset({MachineState.READY.value})
# A film may start on the machine drained for it.
READY_OR_DRAINING = frozenset({MachineState.READY.value, MachineState.DRAINING.value})


def healthy(
    machine: MachineView, snapshot: FleetSnapshot, policy: Policy, states: frozenset[str] = READY_ONLY
) -> bool:
    """Ready, not lost, not cordoned, its worker reported recently, and its agent is not
    backing off after failing StartJob."""
    if machine.state not in states or machine.lost or machine.cordoned:
        return False
    if machine.dispatch_backoff_until is not None and machine.dispatch_backoff_until > snapshot.now:
        return False
    if machine.worker_report_at is None:
        return False
    return snapshot.now - machine.worker_report_at <= timedelta(seconds=policy.worker_fresh_s)


def holds_room(machine: MachineView, snapshot: FleetSnapshot, policy: Policy) -> bool:
    """Whether a machine counts against its pool's and the fleet's ceilings. One of ours
    does from its request until it is stopped, whatever its health (it bills). A box that
    registered itself does only while it can take jobs — its worker reports and it is ready
    — so boxes that registered and went silent cannot fill a pool for good."""
    if machine.state not in BILLING_STATES:  # stopped: it costs no compute, and holds no room
        return False
    return machine.origin != MachineOrigin.REGISTERED or healthy(machine, snapshot, policy)


def assign(
    snapshot: FleetSnapshot, policy: Policy, demand: list[JobView], book: FilmBook | None = None
) -> list[Assignment]:
    """Give free slots to jobs in fair-share order, packing busy machines first so that
    the others go quiet and the money chain can stop them.

    Fair share is re-evaluated as slots are given out: each workspace is one entry of a
    heap keyed by (tier, usage / weight, its oldest job's age), and a workspace that just
    got slots is charged their prospective use (``fair_share_quantum_s`` a slot) before
    the next pick. With no charge this is exactly ``demand``'s order. The free slots are
    indexed (:class:`FreeCapacity`), so the work grows with jobs plus machines.

    A machine earmarked for a film is not capacity for anyone else; the film takes it
    once it is ready (or drained) and wholly free, or takes a wholly free machine first
    if one appears (then its earmark is released by the commit)."""
    if not demand:
        return []  # nothing to place: the free slots need not be indexed
    if book is None:
        book = film_book(snapshot, policy, demand, stale_earmarks(snapshot, demand))
    earmarked = book.earmarked
    capacity = FreeCapacity(
        # A full machine is never capacity: skip it before the health check (most are).
        m
        for m in snapshot.machines
        if len(m.busy_slots) < m.slots and m.id not in earmarked and healthy(m, snapshot, policy)
    )
    queues: dict[str, deque[JobView]] = {}
    usage: dict[str, float] = {}
    for job in demand:
        queues.setdefault(job.workspace_id, deque()).append(job)
        usage.setdefault(job.workspace_id, job.usage)

    def entry(ws: str) -> tuple[int, float, datetime, str, str]:
        head = queues[ws][0]
        return (-head.tier, usage[ws] / head.weight, head.created_at, head.id, ws)

    def take_film(job: JobView) -> tuple[str, tuple[int, ...]] | None:
        mine = book.earmark_of.get(job.id)
        if mine is not None and not mine.busy_slots and healthy(mine, snapshot, policy, READY_OR_DRAINING):
            return mine.id, tuple(range(mine.slots))
        if mine is None and not book.may_hold_one_more(job.pool_id, adds_machine=False):
            return None  # the share cap: the scale step counts why it waits
        got = capacity.take(job)
        if got is not None and mine is None:
            book.hold(job.pool_id, adds_machine=False)
        return got

    heap = [entry(ws) for ws in queues]
    heapq.heapify(heap)
    out: list[Assignment] = []
    while heap:
        ws = heapq.heappop(heap)[-1]
        job = queues[ws].popleft()
        got = take_film(job) if job.whole_machine else capacity.take(job)
        if got is not None:
            machine_id, slots = got
            out.append(Assignment(job_id=job.id, machine_id=machine_id, slots=slots))
            usage[ws] += len(slots) * policy.fair_share_quantum_s
        if queues[ws]:
            heapq.heappush(heap, entry(ws))
    return out


def expected_cost_micros(
    hourly_price_micros: int, capacity_type: str, preemptions: int, spot_seconds: float, policy: Policy
) -> float:
    """Price an hour plus the pre-emption rate times what a pre-emption loses (every job on
    the machine: at most an hour of its work)."""
    if capacity_type != "SPOT":
        return float(hourly_price_micros)
    hours = spot_seconds / 3600.0
    rate = (
        preemptions / hours
        if hours >= 1.0
        else max(policy.spot_preemption_prior_per_hour, preemptions / max(hours, 1.0))
    )
    return hourly_price_micros * (1.0 + rate)


def scale(
    snapshot: FleetSnapshot,
    policy: Policy,
    unmet: list[JobView],
    book: FilmBook | None = None,
    warm: dict[str, int] | None = None,
    why: Why | None = None,
) -> list[StartMachine | CreateMachine]:
    """Start stopped machines or create new ones from the pool's offerings until arriving
    slots cover the unmet demand — within every ceiling.

    The stopped machine with the lowest expected cost an hour starts first (its disk is
    warm); a new machine is created only when none fits. One exception, from the seed's
    "an on-demand one before a machine that keeps being taken back": a stopped machine with
    a pre-emption history whose expected cost exceeds the best offering's waits behind it,
    so a job pre-empted off a spot machine runs again elsewhere. A machine whose start just
    failed waits out its back-off and is not counted as arriving meanwhile.

    Films come first in each pool (see :mod:`~gpufleet.scheduler.tick.films`): each film
    with no machine earmarks the machine started for it, or, when no machine may start,
    drains the ready machine whose jobs end soonest (``book.drains``) — within the share
    cap while shorts wait. Shorts then scale on what is left; a machine earmarked for a
    film is not counted as arriving for them. Last, a pool short of its warm target
    (``warm``: machines missing) is topped up to it.

    Each unmet job's reason goes in ``why`` as the step decides it: the machine on its way
    for it (with when it is expected to take work), the drain, or what stopped the step
    adding one — the fleet's or the pool's ceiling, no usable offering, the films' cap."""
    if not unmet and not warm:
        return []  # nothing waits and no pool is short of its warm machines
    if book is None:
        book = film_book(snapshot, policy, unmet, [])
    why = why if why is not None else {}
    earmarked = book.earmarked
    actions: list[StartMachine | CreateMachine] = []
    # The fleet's ceiling counts every pool's machines: those this snapshot leaves out too.
    running = snapshot.room_held_elsewhere
    running += sum(1 for m in snapshot.machines if holds_room(m, snapshot, policy))
    by_pool: dict[str, list[MachineView]] = {}
    for m in snapshot.machines:
        if m.pool_id is not None:
            by_pool.setdefault(m.pool_id, []).append(m)
    unmet_by_pool: dict[str, list[JobView]] = {}
    for j in unmet:
        unmet_by_pool.setdefault(j.pool_id, []).append(j)
    warm = warm or {}
    for pool_id in sorted(set(unmet_by_pool) | set(warm)):
        pool = snapshot.pools.get(pool_id)
        if pool is None:
            continue
        machines = by_pool.get(pool_id, [])
        in_pool = sum(1 for m in machines if holds_room(m, snapshot, policy))
        stopped = sorted(
            ScaleCandidate(
                expected_cost_micros(
                    m.hourly_price_micros, m.capacity_type, m.preemption_count, m.spot_seconds, policy
                ),
                creates=False,
                key=m.id,
                action=StartMachine(machine_id=m.id),
                risky=m.preemption_count > 0,
            )
            for m in machines
            if m.state == MachineState.STOPPED
            and m.intent != MachineIntent.DESTROYED
            and m.origin == MachineOrigin.PROVISIONED
            and m.managed
            # Cordoned (a GPU fault, or an operator): started, it could take no work.
            and not m.cordoned
            and not _backing_off(m, snapshot)
            and m.id not in earmarked
        )
        fresh = sorted(
            ScaleCandidate(
                expected_cost_micros(o.hourly_price_micros, o.capacity_type, 0, 0.0, policy),
                creates=True,
                key=f"{o.rank:06d}:{o.id}",
                action=CreateMachine(offering_id=o.id, pool_id=pool_id),
            )
            for o in snapshot.offerings
            if o.pool_id == pool_id and _usable(o, snapshot)
        )
        for film in (j for j in unmet_by_pool.get(pool_id, []) if j.whole_machine):
            mine = book.earmark_of.get(film.id)
            if mine is not None:
                book.waits[WAIT_EARMARK] += 1
                why[film.id] = _earmark_wait(mine, pool_id, book, snapshot, policy)
                continue
            room = running < policy.max_running_machines and in_pool < pool.max_machines
            best = _cheapest(stopped, fresh) if room else None
            if best is not None and book.may_hold_one_more(pool_id, adds_machine=True):
                actions.append(dataclasses.replace(best.action, for_job=film.id))
                book.hold(pool_id, adds_machine=True)
                running += 1
                in_pool += 1
                why[film.id] = waiting_for_capacity(
                    pool_id, _added_ready(best.action, machines, snapshot, policy)
                )
                continue
            if not book.may_hold_one_more(pool_id, adds_machine=False):
                book.waits[WAIT_SHARE_CAP] += 1
                why[film.id] = films_share_cap(pool_id, book.share)
                continue
            ready = [m for m in machines if healthy(m, snapshot, policy)]
            drain = choose_drain(ready, book, snapshot.now)
            if drain is None:
                book.waits[WAIT_NO_MACHINE] += 1
                # No room to add one, or nothing to add it from (a refused cap with room
                # would have refused the drain too).
                why[film.id] = (
                    _ceiling(pool, running, policy) if not room else no_usable_offering(pool_id, snapshot)
                )
                continue
            ends_at = book.ends_at(drain.id)
            book.drains.append(Drain(machine_id=drain.id, job_id=film.id, ends_at=ends_at))
            book.hold(pool_id, adds_machine=False)
            why[film.id] = waiting_for_drain(drain.id, ends_at)
        earmarked = book.earmarked

        shorts = [j for j in unmet_by_pool.get(pool_id, []) if not j.whole_machine]
        needed_machines = _machines_needed(shorts, pool.slots_per_machine)
        arriving = [
            m
            for m in machines
            if m.state in ARRIVING
            and m.intent == MachineIntent.RUNNING
            and not m.cordoned
            and not _backing_off(m, snapshot)
            and m.id not in earmarked
        ]
        needed_machines -= sum(m.slots for m in arriving) // max(pool.slots_per_machine, 1)
        added: list[StartMachine | CreateMachine] = []
        while needed_machines > 0 and running < policy.max_running_machines and in_pool < pool.max_machines:
            best = _cheapest(stopped, fresh)
            if best is None:
                break
            actions.append(best.action)
            added.append(best.action)
            needed_machines -= 1
            running += 1
            in_pool += 1
        if shorts:
            blocked = None
            if needed_machines > 0:
                at_ceiling = running >= policy.max_running_machines or in_pool >= pool.max_machines
                blocked = (
                    _ceiling(pool, running, policy) if at_ceiling else no_usable_offering(pool_id, snapshot)
                )
            soonest = sorted(
                ((m.slots, expected_ready(m, snapshot, policy)) for m in arriving),
                key=lambda s: (s[1] is None, s[1] or snapshot.now),
            )
            soonest += [(pool.slots_per_machine, _added_ready(a, machines, snapshot, policy)) for a in added]
            # One reason per machine on its way, shared by the jobs it takes.
            on_the_way = [(slots, waiting_for_capacity(pool_id, ready)) for slots, ready in soonest]
            _shorts_wait(shorts, on_the_way, blocked, why)
        missing = (
            warm.get(pool_id, 0) - len(added) - sum(1 for a in actions if _adds_to(a, pool_id, machines))
        )
        while missing > 0 and running < policy.max_running_machines and in_pool < pool.max_machines:
            best = _cheapest(stopped, fresh)
            if best is None:
                break
            actions.append(best.action)
            missing -= 1
            running += 1
            in_pool += 1
    return actions


def _added_ready(
    action: StartMachine | CreateMachine, machines: list[MachineView], snapshot: FleetSnapshot, policy: Policy
) -> datetime:
    """When a machine this step adds is expected to take work: now plus its offering's
    typical boot (the machine's recorded start is this tick's now, so the next tick
    reads the same time from it)."""
    offering: str | None = None
    if isinstance(action, CreateMachine):
        offering = action.offering_id
    else:
        offering = next((m.offering_id for m in machines if m.id == action.machine_id), None)
    return ready_after(snapshot.now, boot_s(offering, snapshot, policy), snapshot.now)


def _ceiling(pool: PoolView, running: int, policy: Policy) -> Pending:
    """Which ceiling holds: the fleet's running machines, else the pool's."""
    if running >= policy.max_running_machines:
        return fleet_at_ceiling(policy.max_running_machines)
    return pool_at_ceiling(pool.id, pool.max_machines)


def _earmark_wait(
    machine: MachineView, pool_id: str, book: FilmBook, snapshot: FleetSnapshot, policy: Policy
) -> Pending:
    """A film whose machine is held for it: on its way, draining, or ready and not yet
    taking work."""
    if machine.state in ARRIVING:
        return waiting_for_capacity(pool_id, expected_ready(machine, snapshot, policy))
    if machine.state == MachineState.DRAINING or machine.busy_slots:
        return waiting_for_drain(machine.id, book.ends_at(machine.id))
    return held_for_it(machine.id)


def _shorts_wait(
    shorts: list[JobView], on_the_way: list[tuple[int, Pending]], blocked: Pending | None, why: Why
) -> None:
    """Short jobs in the order slots go to them take the slots on their way, soonest
    machine first (a job takes its slots on one machine); the jobs no such slot covers
    wait for what stopped the scale step (``blocked``), else — the step counts slots, not
    machines — for the last machine on its way."""
    i, left = 0, on_the_way[0][0] if on_the_way else 0
    for job in shorts:
        while i < len(on_the_way) and left < job.slots_needed:
            i += 1
            left = on_the_way[i][0] if i < len(on_the_way) else 0
        if i < len(on_the_way):
            left -= job.slots_needed
            why[job.id] = on_the_way[i][1]
        elif blocked is not None:
            why[job.id] = blocked
        elif on_the_way:
            why[job.id] = on_the_way[-1][1]


def _adds_to(action: StartMachine | CreateMachine, pool_id: str, machines: list[MachineView]) -> bool:
    """A film's start or create in this pool: it counts toward the warm target too."""
    if action.for_job is None:
        return False
    if isinstance(action, CreateMachine):
        return action.pool_id == pool_id
    return any(m.id == action.machine_id for m in machines)


def _cheapest(stopped: list[ScaleCandidate], fresh: list[ScaleCandidate]) -> ScaleCandidate | None:
    """The next machine to add: the cheapest stopped one unless it keeps being taken back
    and an offering is cheaper; else the best offering. A stopped machine is taken off
    ``stopped`` (it starts once; an offering can be bought again)."""
    best_offer = fresh[0] if fresh else None
    best = next(
        (
            c
            for c in stopped
            if not c.risky or best_offer is None or best_offer.expected_cost_micros >= c.expected_cost_micros
        ),
        best_offer or (stopped[0] if stopped else None),
    )
    if best is not None and not best.creates:
        stopped.remove(best)
    return best


def _backing_off(machine: MachineView, snapshot: FleetSnapshot) -> bool:
    return machine.backoff_until is not None and machine.backoff_until > snapshot.now


def _machines_needed(shorts: list[JobView], slots_per_machine: int) -> int:
    return math.ceil(sum(j.slots_needed for j in shorts) / max(slots_per_machine, 1))


def _usable(offering: OfferingView, snapshot: FleetSnapshot) -> bool:
    if offering.id in snapshot.quarantined_offerings:
        return False
    if snapshot.served_offerings is not None and offering.id not in snapshot.served_offerings:
        return False  # no driver for its provider here: a create could only be refused
    return (offering.provider, offering.region) not in snapshot.halted_regions


def expired_leases(attempts: list[AttemptView], snapshot: FleetSnapshot) -> list[str]:
    """Live attempts whose lease ran out: the machine was lost."""
    return _attempts_to_end(attempts, snapshot.now)[0]


def over_time_limit(attempts: list[AttemptView], snapshot: FleetSnapshot) -> list[str]:
    """Live attempts past their kind's limit, counted from the start of this attempt (an
    attempt whose lease ran out is lost, not timed out)."""
    return _attempts_to_end(attempts, snapshot.now)[1]


def _attempts_to_end(attempts: list[AttemptView], now: datetime) -> tuple[list[str], list[str]]:
    """``expired_leases`` and ``over_time_limit`` in one pass over the live attempts."""
    expired: list[str] = []
    over: list[str] = []
    # One cutoff per distinct limit (a few kinds), not a timedelta per attempt, made when
    # the first attempt of that limit is met.
    cutoffs: dict[float, datetime] = {}
    for a in attempts:
        if a.lease_expires_at < now:
            expired.append(a.id)
            continue
        cutoff = cutoffs.get(a.time_limit_s)
        if cutoff is None:
            cutoff = cutoffs[a.time_limit_s] = now - timedelta(seconds=a.time_limit_s)
        if a.started_at < cutoff:
            over.append(a.id)
    return expired, over
