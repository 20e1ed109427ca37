"""One pool's machine and attempt rows as the fleet tick's snapshot reads them, kept from
one tick to the next and touched only where something changed.

A row's view is dropped when a field it is built from is written (``Machine.__setattr__``;
``Machine.drop_view`` where its slot map changes in place), and the machine's id is then
left in the pool's ``stale`` set; an attempt that starts running leaves it there too. A
machine joins the rows when it is created and leaves them when it is destroyed. A tick
reads anew what is stale and refreshes the report clocks whose kept value is due (a heap by
when each falls due), so its cost grows with what changed and with the clocks due, not
with the pool. The views it hands the tick are the ones a pass over every row would have
built, in the same order (the pool's machines by id, each one's live attempts in turn).
"""

from __future__ import annotations

import heapq
import math
from datetime import datetime, timedelta

from gpufleet.scheduler.tick.model import AttemptView, MachineView
from gpufleet.sim.records import INF, Attempt, Machine

_SECONDS = [timedelta(seconds=i) for i in range(3600)]


# A machine's place in the rows before its first read (it joined since the last tick).
_UNREAD = MachineView(
    id="",
    pool_id=None,
    state="",
    intent="",
    origin="",
    managed=False,
    lost=False,
    cordoned=False,
    slots=0,
    busy_slots=frozenset(),
    worker_report_at=None,
    hourly_price_micros=0,
    capacity_type="",
    preemption_count=0,
    spot_seconds=0.0,
    backoff_until=None,
    agent_address=None,
)


def _lease(a: Attempt, last: datetime | None, lease: timedelta) -> datetime:
    """An attempt's lease: its worker's last report (or its start, if later) plus the lease."""
    if last is None or last < a.started_dt:
        return a.started_dt + lease
    return last + lease


class PoolRows:
    """The views of one pool's live machines (by id) and of their live attempts.

    The only thing that moves on its own is a reporting worker's report clock, which the
    tick reads for one question: is it under ``fresh_s`` (the scheduler's
    ``worker_fresh_s``) old? A kept clock is refreshed once it is ``refresh_s`` old — a
    heartbeat less than the smaller of ``fresh_s`` and the attempt lease ``lease_s``, both
    the scheduler's settings — so the answer is the one a fresh read gives (a kept value is
    at most that old, a fresh one at most a heartbeat). An attempt's lease is its machine's
    report clock (as that view holds it) plus the attempt lease, so a reporting worker's
    lease is always more than a heartbeat ahead — never expired, as a fresh read would say
    — and a silent worker's stands still at the true one."""

    def __init__(self, heartbeat_s: float, slots_per_machine: int, lease_s: float, fresh_s: float) -> None:
        self.heartbeat_s = heartbeat_s
        self.slots_per_machine = slots_per_machine
        self.lease = timedelta(seconds=lease_s)
        # (50 s under the defaults: a 60 s freshness, a 90 s lease, a 10 s heartbeat.)
        self.refresh_s = max(0.0, min(fresh_s, lease_s) - heartbeat_s)
        # Ids of the pool's machines whose view or live attempts changed since the last read.
        self.stale: set[str] = set()
        self._order: list[Machine] = []  # the pool's live machines by id
        self._index: dict[str, int] = {}
        self.machines: list[MachineView] = []  # their views, in the same order
        self._attempts_of: list[list[AttemptView]] = []
        self.attempts: list[AttemptView] = []
        # Until when each kept view's report clock answers "fresh" as a new read would
        # (INF: its worker does not report, the clock stands still), and the finite ones
        # as (until, id, machine) in buckets of a whole second, with a heap of the buckets'
        # seconds; an entry whose time is not the machine's any more was read anew since
        # (or the machine left) and is passed over.
        self._fresh: dict[str, float] = {}
        self._due: dict[int, list[tuple[float, str, Machine]]] = {}
        self._due_seconds: list[int] = []
        self._heartbeats = range(math.ceil(heartbeat_s))

    def add(self, m: Machine) -> None:
        """A new machine joins the pool: the newest, so the last by id. Its view is read at
        the next tick."""
        if self._order and self._order[-1].id >= m.id:
            raise ValueError(f"machine {m.id} joins the pool after {self._order[-1].id}")
        self._index[m.id] = len(self._order)
        self._order.append(m)
        self.machines.append(_UNREAD)
        self._attempts_of.append([])
        self._fresh[m.id] = INF
        self.stale.add(m.id)

    def remove(self, m: Machine) -> None:
        """The machine leaves the pool (destroyed)."""
        i = self._index.pop(m.id)
        del self._order[i], self.machines[i], self._attempts_of[i], self._fresh[m.id]
        for j in range(i, len(self._order)):
            self._index[self._order[j].id] = j
        self.attempts = [av for avs in self._attempts_of for av in avs]

    def read(self, now: float, nowd: datetime) -> None:
        """Bring ``machines`` and ``attempts`` up to ``now``."""
        if self.stale:
            index, order = self._index, self._order
            changed = False
            for mid in self.stale:
                i = index.get(mid)
                if i is not None and self._read_machine(i, order[i], now, nowd):
                    changed = True
            self.stale.clear()
            if changed:
                self.attempts = [av for avs in self._attempts_of for av in avs]
        seconds = self._due_seconds
        if not seconds or seconds[0] >= now:
            return
        # The report clocks due: every reporting worker's last heartbeat is one of a
        # heartbeat's whole seconds before now, and its attempts' leases that plus the lease.
        reports = [nowd - _SECONDS[k] for k in self._heartbeats]
        lease_td, refresh_s = self.lease, self.refresh_s
        leases = [r + lease_td for r in reports]
        fresh, hb, due, later = self._fresh, self.heartbeat_s, self._due, []
        while seconds and seconds[0] < now:
            for entry in due.pop(heapq.heappop(seconds)):
                until, mid, m = entry
                if fresh.get(mid) != until:
                    continue  # read anew since, or it left the pool
                if until >= now:
                    later.append(entry)  # in the bucket of this very second, not yet due
                    continue
                sd = m.startup_done_at
                view = m.view
                assert view is not None  # a dropped view is stale, and read above
                if sd <= now < m.worker_stopped_at:
                    k = int((now - sd) % hb)
                    report: datetime | None = reports[k]
                    # ``_set_fresh_until``, written out.
                    until = fresh[mid] = now - k + refresh_s
                    second = int(until)
                    bucket = due.get(second)
                    if bucket is None:
                        bucket = due[second] = []
                        heapq.heappush(seconds, second)
                    bucket.append((until, mid, m))
                    # Written into the frozen views' fields directly (as ``object.__setattr__``
                    # would, at half the cost): this runs for half the pool every tick.
                    view.__dict__["worker_report_at"] = report
                    for a in m.live_attempts:
                        av = a.view
                        if av is not None:
                            started = a.started_dt
                            lease = started + lease_td if report < started else leases[k]  # type: ignore[operator]
                            av.__dict__["lease_expires_at"] = lease
                            a.lease_from = report
                else:
                    report = m.worker_report_at(now, hb)
                    fresh[mid] = INF
                    object.__setattr__(view, "worker_report_at", report)
                    for a in m.live_attempts:
                        av = a.view
                        if av is not None and a.lease_from is not report:
                            object.__setattr__(av, "lease_expires_at", _lease(a, report, lease_td))
                            a.lease_from = report
        for until, _, m in later:
            self._set_fresh_until(m, until)

    def _read_machine(self, i: int, m: Machine, now: float, nowd: datetime) -> bool:
        """Machine ``i``'s view and its attempts' views, as a pass over every row reads them.
        True if its attempts' views are not the ones it had."""
        view = m.view
        if view is None:
            view = m.view = self._build_view(m, now, nowd)
            self._set_fresh_until(m, self._fresh_until_of(m, now))
        elif now > self._fresh[m.id]:
            self._refresh(m, view, now, nowd)
        self.machines[i] = view
        report = view.worker_report_at
        avs = []
        for a in m.live_attempts:
            av = a.view
            if av is None or av.state != a.state:
                av = a.view = self._attempt_view(a, view)
            elif a.lease_from is not report:
                object.__setattr__(av, "lease_expires_at", _lease(a, report, self.lease))
            a.lease_from = report
            avs.append(av)
        before = self._attempts_of[i]
        if len(avs) == len(before) and all(x is y for x, y in zip(avs, before, strict=True)):
            return False
        self._attempts_of[i] = avs
        return True

    def _set_fresh_until(self, m: Machine, until: float) -> None:
        self._fresh[m.id] = until
        if until < INF:
            second = int(until)
            bucket = self._due.get(second)
            if bucket is None:
                bucket = self._due[second] = []
                heapq.heappush(self._due_seconds, second)
            bucket.append((until, m.id, m))

    def _refresh(self, m: Machine, view: MachineView, now: float, nowd: datetime) -> None:
        """The kept view's report clock read anew (written in place, as the database row
        would be: the tick keeps no view from one tick to the next)."""
        sd = m.startup_done_at
        if sd <= now < m.worker_stopped_at:
            k = int((now - sd) % self.heartbeat_s)
            object.__setattr__(view, "worker_report_at", nowd - _SECONDS[k])
            self._set_fresh_until(m, now - k + self.refresh_s)
        else:
            object.__setattr__(view, "worker_report_at", m.worker_report_at(now, self.heartbeat_s))
            self._set_fresh_until(m, INF)

    def _fresh_until_of(self, m: Machine, now: float) -> float:
        """Until when the view's report clock may be kept: forever for a worker that does
        not report (its clock stands still)."""
        if not m.reporting(now):
            return INF
        return now - int((now - m.startup_done_at) % self.heartbeat_s) + self.refresh_s

    def _report(self, m: Machine, now: float, nowd: datetime) -> datetime | None:
        """The report clock at ``now``. A reporting worker's last heartbeat is taken to the
        whole second below it (at most a second older: never a fresher channel than the
        truth)."""
        if m.reporting(now):
            return nowd - _SECONDS[int((now - m.startup_done_at) % self.heartbeat_s)]
        return m.worker_report_at(now, self.heartbeat_s)

    def _build_view(self, m: Machine, now: float, nowd: datetime) -> MachineView:
        # The row's columns set directly, not through the frozen dataclass's ``__init__``
        # (a field at a time through ``object.__setattr__``): the same view, at a third of
        # the cost, built a few times every tick.
        view = object.__new__(MachineView)
        view.__dict__.update(
            id=m.id,
            pool_id=m.offering.pool,
            state=m.state,
            intent=m.intent,
            origin="PROVISIONED",
            managed=True,
            lost=m.lost,
            cordoned=m.cordoned,
            slots=self.slots_per_machine,
            # Live attempts' slots, and those of ended ones whose process the worker has not
            # reported gone (``holds_slot``), as the snapshot reads both.
            busy_slots=frozenset(m.attempts.keys() | m.held.keys()) if m.held else frozenset(m.attempts),
            worker_report_at=self._report(m, now, nowd),
            hourly_price_micros=m.offering.hourly_price_micros,
            capacity_type=m.offering.capacity_type,
            preemption_count=m.preemptions,
            spot_seconds=m.spot_seconds,
            backoff_until=m.backoff_until,
            agent_address="sim",
            dispatch_backoff_until=m.dispatch_backoff_until,
            earmarked_for=m.earmarked_for,
            warm_held=m.warm_held,
        )
        return view

    def _attempt_view(self, a: Attempt, m: MachineView) -> AttemptView:
        return AttemptView(
            id=a.id,
            job_id=a.job.id,
            machine_id=m.id,
            state=a.state,
            started_at=a.started_dt,
            lease_expires_at=_lease(a, m.worker_report_at, self.lease),
            slots=len(a.slots),
            time_limit_s=a.job.time_limit_s,
            expected_s=a.job.expected_s,
            whole_machine=a.job.whole,
        )
