"""The virtual clock and the event queue: time moves only from one event to the next.

Times inside the simulator are float seconds from the start of the run; the decisions under
test take aware datetimes, made once per event by :meth:`EventQueue.dt`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

EPOCH = datetime(2026, 11, 1, tzinfo=UTC)

Action = Callable[[], None]


class EventQueue:
    """A heap of (time, rank, sequence, action): equal times run by rank, then in the order
    they were pushed, so one seed gives one order of events and the same month, bit for bit.

    The world's own events are rank 0. The loops that run on a fixed grid (the hourly
    sample, each net's passes, the fleet tick) have a rank of their own, so where one of
    them stands among the events of its instant does not depend on when it was pushed: a
    pass the simulator skips (nothing due) and pushes later, only once something falls due,
    runs exactly where a pass pushed one cadence before would have run."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Action]] = []
        self._seq = 0
        self.now = 0.0
        self.rank = 0  # the rank of the event running now

    def at(self, t: float, action: Action, rank: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (max(t, self.now), rank, self._seq, action))

    def after(self, delay: float, action: Action) -> None:
        self.at(self.now + delay, action)

    def run_until(self, end: float, on_progress: Callable[[float], None] | None = None) -> int:
        heap = self._heap
        n = 0
        next_report = 0.0
        while heap and heap[0][0] <= end:
            t, self.rank, _, action = heapq.heappop(heap)
            self.now = t
            action()
            n += 1
            if on_progress is not None and t >= next_report:
                on_progress(t)
                next_report = t + 3600.0
        self.now = end
        self.rank = 0
        return n


def dt(t: float) -> datetime:
    """The datetime of ``t``; the last one made is kept, since one event asks for its own
    time several times (a tick's snapshot, each attempt it starts, each row it moves)."""
    global _last_t, _last_d
    if t != _last_t:
        _last_t, _last_d = t, EPOCH + timedelta(seconds=t)
    return _last_d


_last_t, _last_d = math.nan, EPOCH


def secs(d: datetime) -> float:
    return (d - EPOCH).total_seconds()


def grid_floor(t: float, step: float) -> float:
    """The last tick of a loop running every ``step`` (from 0) at or before ``t``."""
    return math.floor(t / step) * step


def grid_ceil(t: float, step: float) -> float:
    """The first tick at or after ``t``."""
    return math.ceil(t / step) * step


def grid_after(t: float, step: float) -> float:
    """The first tick strictly after ``t``: the pass that first finds a strict gate past
    (``waited > deadline``) that ``t`` is the edge of."""
    return (math.floor(t / step) + 1) * step
