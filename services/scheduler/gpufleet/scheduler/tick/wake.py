"""When the fleet tick's decision can next change with nothing but time passing: its
requeue-after (issue 26 item 4; Karpenter's reconcilers return one the same way).

:func:`~gpufleet.scheduler.tick.decide.decide` reads the clock only through ``snapshot.now``
and a few gates; a decision taken at any instant before the earliest of them flips is the
decision taken now. This lists every one of those gates, each at the first instant it
reads differently:

- a machine's dispatch back-off and its provider-call back-off end (``until > now``: at
  ``until``);
- a ready machine's worker goes stale (fresh while ``now - report <= worker_fresh_s``:
  just after);
- a live attempt's lease runs out and its time limit passes (``lease < now``,
  ``started < now - limit``: just after), and — while a film waits — a running job's
  expected end passes (the film drains the machine whose jobs end soonest, every end past
  counting as now);
- a held-back job's back-off ends (``not_before``), and a queued job comes near its
  queue-wait deadline (its recorded reason changes).

A waiting job's expected ready time (a machine on its way) moves with the clock in its
words only, and the fair-share usage the snapshot carries does not move at all within it:
neither is a gate. ``tests/unit/scheduler/test_wake.py`` checks the list against
:func:`decide` itself: over random fleets, the decision at any instant before the wake is
the decision now. The simulator, whose loop is driven by events, wakes a pool for the
clocks it knows; a month that also wakes at every decision's :func:`next_wake` is the same
month (tests/sim/test_event_driven.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from gpufleet.scheduler.tick.model import FleetSnapshot, HeldBackJob, JobView, Policy

# The first instant after a strict gate's time (``t < now`` flips just after ``t``).
_JUST_AFTER = timedelta(microseconds=1)


def next_wake(snapshot: FleetSnapshot, policy: Policy) -> datetime | None:
    """The earliest instant after ``snapshot.now`` at which :func:`decide` over the same
    rows may decide differently (None: never, while the rows stay as they are). Computed
    apart from ``decide``, over its inputs, for the callers that wait on it: a pass over
    every machine and live attempt, which a tick that runs on its cadence need not pay."""
    now = snapshot.now
    fresh = timedelta(seconds=policy.worker_fresh_s)
    times: list[datetime | None] = []
    for m in snapshot.machines:
        times.append(m.dispatch_backoff_until)
        times.append(m.backoff_until)
        if m.worker_report_at is not None:
            times.append(m.worker_report_at + fresh + _JUST_AFTER)
    # A running job's expected end matters only to a film waiting for a machine to drain.
    film_waits = any(j.whole_machine for j in snapshot.queued)
    for a in snapshot.live_attempts:
        times.append(a.lease_expires_at + _JUST_AFTER)
        times.append(a.started_at + timedelta(seconds=a.time_limit_s) + _JUST_AFTER)
        if film_waits:
            times.append(a.expected_end)
    times.extend(j.not_before for j in snapshot.held_back)
    times.extend(_near_deadline(snapshot.queued, policy.deadline_near_share))
    times.extend(_near_deadline(snapshot.held_back, policy.deadline_near_share))
    return _earliest(now, times)


def _near_deadline(jobs: Iterable[JobView | HeldBackJob], share: float) -> Iterable[datetime]:
    """When each waiting job comes near its queue-wait deadline (pending.near_deadline)."""
    for j in jobs:
        if j.waiting_since is not None and j.queue_wait_deadline_s > 0:
            yield j.waiting_since + timedelta(seconds=j.queue_wait_deadline_s * share)


def _earliest(now: datetime, times: Iterable[datetime | None]) -> datetime | None:
    later = [t for t in times if t is not None and t > now]
    return min(later) if later else None
