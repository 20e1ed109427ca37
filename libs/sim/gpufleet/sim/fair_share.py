"""Fair-share usage as the scheduler reads it, kept incrementally for the simulator.

The fleet tick orders queued jobs by their workspace's GPU slot-seconds over the last
``fair_share_window_s`` divided by its plan's weight (DESIGN §7). The scheduler's snapshot
(:func:`gpufleet.scheduler.tick.snapshot.load_snapshot`) computes the usage as

- every live attempt's slot-seconds so far (now - its start, times its slots), plus
- the whole slot-seconds of every attempt that ended within the window (``ended_at >=
  now - window``),

and this class gives the same number without a scan: a running sum of the live attempts'
slots and starts, and a queue of ended attempts evicted as they leave the window. The
simulator had decayed usage with a one-day half-life instead and left live attempts out —
the same input to the real ``decide`` computed two ways (issue #26);
``tests/sim/test_fair_share.py`` holds this to the scheduler's own query on a database.

Usage moves with the clock alone (live attempts grow it, the window drops ended ones), so
the order of two workspaces can change with no event: :func:`next_order_change` says when
the tick must look again, which the event-driven simulator turns into a wake-up (issue #26
item 4: every decision says when it next needs to run).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field


@dataclass
class _Workspace:
    live_slots: int = 0
    live_start_slots: float = 0.0  # sum of start x slots over the live attempts
    ended: deque[tuple[float, float]] = field(default_factory=deque)  # (ended at, slot-seconds)
    ended_sum: float = 0.0


class WindowUsage:
    """Per workspace: slot-seconds of its live attempts plus those of its attempts ended
    within the window. Times are the simulator's seconds; ends arrive in time order."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._ws: dict[str, _Workspace] = {}

    def started(self, workspace: str, at: float, slots: int) -> None:
        w = self._ws.setdefault(workspace, _Workspace())
        w.live_slots += slots
        w.live_start_slots += at * slots

    def ended(
        self, workspace: str, started: float, at: float, slots: int, measured_slot_s: float | None = None
    ) -> float:
        """The attempt started at ``started`` ended at ``at``: its slot-seconds, now counted
        as an ended attempt's — those its worker measured (``measured_slot_s``: the process's
        own run, as a completion reports it), else the time since it started, as the job
        writer records an end the control plane made."""
        w = self._ws[workspace]
        w.live_slots -= slots
        w.live_start_slots -= started * slots
        if w.live_slots == 0:
            w.live_start_slots = 0.0  # no float residue once nothing runs
        slot_s = (at - started) * slots if measured_slot_s is None else measured_slot_s
        w.ended.append((at, slot_s))
        w.ended_sum += slot_s
        return slot_s

    def live_slots(self, workspace: str) -> int:
        """How fast its usage grows now: slot-seconds a second."""
        w = self._ws.get(workspace)
        return w.live_slots if w is not None else 0

    def next_eviction(self, workspace: str) -> float:
        """When its oldest ended attempt in the window leaves it (usage drops then: just
        after, as the scheduler's ``ended_at >= now - window`` keeps it at the instant)."""
        w = self._ws.get(workspace)
        return w.ended[0][0] + self.window_s if w is not None and w.ended else float("inf")

    def at(self, workspace: str, now: float) -> float:
        w = self._ws.get(workspace)
        if w is None:
            return 0.0
        since = now - self.window_s
        while w.ended and w.ended[0][0] < since:
            w.ended_sum -= w.ended.popleft()[1]
        if not w.ended:
            w.ended_sum = 0.0
        live = max(0.0, now * w.live_slots - w.live_start_slots)
        return w.ended_sum + live


def next_order_change(usage: WindowUsage, weights: dict[str, float], now: float) -> float:
    """The earliest time after ``now`` at which the fair-share order of these workspaces
    (usage / weight) can change with no event: one of them loses an ended attempt from its
    window, or two neighbours in today's order cross (only neighbours can cross first, as
    in a kinetic sorted list). ``now`` itself when two keys are equal now and will part (the
    tie-break by age may flip at once). Infinity when nothing can change."""
    # Usage first: reading it at ``now`` drops what left the window, so the evictions
    # asked for next are all still ahead (one already past would wake the pool at once).
    keyed = sorted(
        (usage.at(ws, now) / weight, usage.live_slots(ws) / weight) for ws, weight in weights.items()
    )
    wake = min((usage.next_eviction(ws) for ws in weights), default=float("inf"))
    for (key_a, rate_a), (key_b, rate_b) in itertools.pairwise(keyed):
        if rate_a > rate_b:  # the lower key grows faster: it catches up
            wake = min(wake, now + (key_b - key_a) / (rate_a - rate_b))
        elif key_a == key_b and rate_a != rate_b:  # tied now, parting at once
            wake = now
    return max(wake, now)
