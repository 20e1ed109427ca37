"""The virtual clock and the event queue: time moves only from one event to the next.

Times inside the simulator are float seconds from the start of the run; the decisions under
test take aware datetimes, made once per event by :meth:`EventQueue.dt`.
"""

from __future__ import annotations

import bisect
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


def grid_after(t: float, step: float) -> float:
    """The first tick strictly after ``t``: the pass that first finds a strict gate past
    (``waited > deadline``) that ``t`` is the edge of."""
    return (math.floor(t / step) + 1) * step


class Passes:
    """Where one control-plane loop's passes fall: every ``every`` seconds from the month's
    start (the first one cadence in), and — once its process starts anew (a restart's end,
    a standby taking over a paused leader's lease) or its leader comes back to a pass it
    owes — every ``every`` seconds from then, as a new process's ``Ticker`` runs each task
    at once and then at its cadence (``gpufleet.common.loops``: ``next_at = now + cadence``).

    A run of passes is a segment: from ``since`` (its first pass, the grid's origin) until
    ``until`` (exclusive: the process stopped then), and no pass falls between two
    segments. A loop's channels (the probe and listing clocks a net writes) are read off
    the same passes, so a restart's silence and its new phase reach them too."""

    def __init__(self, every: float) -> None:
        if every <= 0:
            raise ValueError(f"a loop's cadence must be positive, not {every}")
        self.every = every
        self._since: list[float] = [0.0]
        self._until: list[float] = [math.inf]
        self._plain = True  # one segment from the month's start: the grid's arithmetic alone

    def restart(self, stopped: float, at: float) -> None:
        """The loop's process stops at ``stopped`` and a new one's first pass is at ``at``.
        A stop before the last segment began (a second restart within one) moves that
        segment's start, never earlier than it was."""
        if at < stopped:
            raise ValueError(f"a loop cannot start again ({at}) before it stopped ({stopped})")
        if len(self._since) > 1 and stopped <= self._since[-1]:
            self._since[-1] = max(self._since[-1], at)
            return
        self._until[-1] = min(self._until[-1], stopped)
        self._since.append(at)
        self._until.append(math.inf)
        self._plain = False

    def owes(self, since: float, until: float) -> bool:
        """Whether a pass falls in ``[since, until)`` (one a paused leader owes on waking)."""
        return self.ceil(since) < until

    def _segment(self, t: float) -> int:
        return bisect.bisect_right(self._since, t) - 1

    def _k(self, i: int, t: float, up: bool) -> int:
        """The index of segment ``i``'s pass at or after ``t`` (``up``) or at or before it.
        The month's first segment is the plain grid (``k * every``: exact); a later one's
        passes are ``since + k * every`` as floats, and the index is the one whose float is
        on the right side of ``t`` (the quotient alone can be an ulp off)."""
        since, every = self._since[i], self.every
        if i == 0:
            return math.ceil(t / every) if up else math.floor(t / every)
        k = math.ceil((t - since) / every) if up else math.floor((t - since) / every)
        if up:
            while k > 0 and since + (k - 1) * every >= t:
                k -= 1
            while since + k * every < t:
                k += 1
        else:
            while since + (k + 1) * every <= t:
                k += 1
            while k >= 0 and since + k * every > t:
                k -= 1
        return k

    def _at(self, i: int, k: int) -> float:
        return k * self.every if i == 0 else self._since[i] + k * self.every

    def _first_from(self, i: int, t: float, strict: bool) -> float:
        """Segment ``i``'s first pass at (or strictly after) ``t``, or INF if it has none."""
        k = self._k(i, t, up=True)
        if strict and self._at(i, k) == t:
            k += 1
        k = max(k, 1 if i == 0 else 0)  # the month's first pass is one cadence in
        at = self._at(i, k)
        return at if at < self._until[i] else math.inf

    def ceil(self, t: float, strict: bool = False) -> float:
        """The first pass at ``t`` or after it (``strict``: after it); INF if none is known."""
        if self._plain:  # never restarted (most loops, most of a month): the plain grid
            every = self.every
            k = math.floor(t / every) + 1 if strict else math.ceil(t / every)
            return (k if k > 1 else 1) * every
        i = self._segment(t)
        at = self._first_from(i, t, strict)
        while at == math.inf and i + 1 < len(self._since):
            i += 1
            at = self._first_from(i, self._since[i], False)
        return at

    def after(self, t: float) -> float:
        """The first pass strictly after ``t``."""
        return self.ceil(t, strict=True)

    def floor(self, t: float) -> float:
        """The last pass at ``t`` or before it; -INF if none."""
        if self._plain:
            k = math.floor(t / self.every)
            return k * self.every if k >= 1 else -math.inf
        i = self._segment(t)
        while i >= 0:
            until = self._until[i]
            k = self._k(i, t, up=False)
            while k >= 0 and self._at(i, k) >= until:
                k -= 1  # the segment ended before t: its last pass is before its end
            if k >= (1 if i == 0 else 0):
                return self._at(i, k)
            i -= 1
        return -math.inf

    def count(self, end: float) -> int:
        """How many passes fall at or before ``end``."""
        n = 0
        for i, since in enumerate(self._since):
            if since > end:
                break
            first = self._first_from(i, since, False)
            if first > end:
                continue
            until = self._until[i]
            last = self._k(i, min(end, until), up=False)
            while self._at(i, last) >= until:
                last -= 1
            n += max(0, last - self._k(i, first, up=True) + 1)
        return n
