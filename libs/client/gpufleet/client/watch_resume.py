"""How a watch goes on across a lost stream: where it stopped, and how long it keeps
trying to reach the scheduler again.

Every event WatchJob sends carries a ``sequence``, strictly increasing per job, and a
request may say ``after_sequence``: the server then sends only the later events. So a
watch reopens its stream after the last sequence it gave, and the server sends exactly
what it missed — nothing twice, nothing skipped, whether the scheduler restarted or the
connection was cut. The watch still drops an event whose sequence is not past the last
one given, so a server that ignored the resume point could not make it repeat itself.

Both clients use one :class:`WatchResume` per watch; the sync and asyncio loops differ
only in how they wait.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from gpufleet.client.errors import GpufleetApiError
from gpufleet.v1 import job_pb2

FINAL_STATES = frozenset(
    {
        job_pb2.JOB_STATE_SUCCEEDED,
        job_pb2.JOB_STATE_FAILED,
        job_pb2.JOB_STATE_CANCELLED,
        job_pb2.JOB_STATE_TIMED_OUT,
    }
)
# A stream that ends with one of these is opened again: the scheduler went away (or its
# connection did), or the stream's own deadline ran out and a new one is due.
REOPEN_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# Between two reopenings that heard nothing, unless the server said how long to wait.
FIRST_PAUSE_S = 0.25
MAX_PAUSE_S = 5.0


class WatchResume:
    """The state of one watch: the last event given, and the current outage if the stream
    is lost.

    ``reconnect_within`` bounds an outage: from the moment a stream that had answered is
    lost, the watch keeps reopening it for that many seconds, then raises the last error.
    """

    def __init__(self, reconnect_within: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.reconnect_within = reconnect_within
        self._clock = clock
        # The sequence of the last event given: the resume point of the next stream.
        self.after_sequence = 0
        self._outage_since: float | None = None
        self._quiet_cuts = 0
        self.ended = False

    def heard(self, event: job_pb2.JobEvent) -> bool:
        """The stream answered with ``event``: the outage, if any, is over. True when the
        event is new and should be given to the caller."""
        self._outage_since = None
        self._quiet_cuts = 0
        if event.sequence <= self.after_sequence:
            return False
        self.after_sequence = event.sequence
        if event.state in FINAL_STATES:
            self.ended = True
        return True

    def cut(self, error: GpufleetApiError) -> float | None:
        """The stream ended with ``error``: how long to wait before reopening it, or None
        when the watch must give up and raise it."""
        if error.code not in REOPEN_CODES:
            return None
        now = self._clock()
        if self._outage_since is None:
            # The first loss after an answer: reopen at once (the channel waits for the
            # server to be back before the stream is opened).
            self._outage_since = now
            return 0.0
        if now - self._outage_since >= self.reconnect_within:
            return None
        self._quiet_cuts += 1
        if error.retry_after is not None:
            pause = error.retry_after.total_seconds()
        else:
            pause = min(FIRST_PAUSE_S * 2 ** (self._quiet_cuts - 1), MAX_PAUSE_S)
        return min(pause, self.time_left())

    def time_left(self) -> float:
        """Seconds left of the current outage's allowance (all of it when there is none)."""
        if self._outage_since is None:
            return self.reconnect_within
        return max(0.0, self.reconnect_within - (self._clock() - self._outage_since))
