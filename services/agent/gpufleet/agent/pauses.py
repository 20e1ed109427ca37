"""Whether this process was paused, and whether a start may have waited out its caller
through the pause.

A StartJob the scheduler gave up on must never start: the scheduler takes the attempt back
once ``dispatch_deadline_s`` passed and may run the job on another machine at once
(docs/leases.md, the first lease's hand-off). gRPC drops a call whose deadline passed
before its handler ran, but the server starts a call's deadline when it *reads* the call:
a call that arrived while this process was not running — SIGSTOP, a paused or migrating
VM, a host starved of CPU — is read after the pause with its whole timeout still ahead of
it, and the caller's cancel, sent when it gave up, may be read only after the handler ran.
Only this process can tell it was not running: a thread notes the monotonic clock every
``every_s``; a gap well past that is a pause.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# A gap this much longer than the watch's period is a pause (shorter ones are noise that no
# caller's deadline notices).
FLOOR_S = 0.25
# A running process reads a call that arrived this soon: a call handled later than this
# after a pause ended arrived after it.
READ_SLACK_S = 0.5


@dataclass(frozen=True)
class Pause:
    """An interval (monotonic seconds) in which this process did not run."""

    began: float
    ended: float


def may_have_outlived(pause: Pause | None, *, handled_at: float, now: float, remaining_s: float) -> bool:
    """Whether a call whose handler began at ``handled_at``, with ``remaining_s`` of its
    server-side deadline left ``now``, may be one its caller has already given up on.

    Only a call that could have arrived before or during the pause is in doubt: one whose
    handler began no more than :data:`READ_SLACK_S` after the pause ended. The server
    started its deadline after the pause, so the caller's timeout is at least
    ``remaining_s + (now - handled_at)``; a call that arrived before the pause began was
    read before it (its deadline then counts the pause), so one in doubt was sent no
    earlier than the pause began. If that much time has passed since then, its caller may
    have given up.
    A call in doubt is refused: the scheduler then backs the machine off and dispatches
    again, where a start it took back would run beside the job's retry."""
    if pause is None or pause.ended < handled_at - READ_SLACK_S:
        return False
    least_timeout_s = remaining_s + (now - handled_at)
    return now - pause.began >= least_timeout_s


class PauseWatch:
    """The process's last pause, as a daemon thread ticking every ``every_s`` sees it."""

    def __init__(self, every_s: float = 0.05, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._last_tick = monotonic()
        self._pause: Pause | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pause-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def tick(self) -> None:
        """One look at the clock (the thread's loop; a test calls it directly)."""
        now = self.monotonic()
        with self._lock:
            if now - self._last_tick >= self.every_s + FLOOR_S:
                self._pause = Pause(self._last_tick, now)
            self._last_tick = now

    def last(self, at: float) -> Pause | None:
        """The last pause up to ``at``, including one the thread has not yet seen end: the
        handler of a call read right after a pause may run before the watch's thread does."""
        with self._lock:
            if at - self._last_tick >= self.every_s + FLOOR_S:
                return Pause(self._last_tick, at)
            return self._pause

    def _run(self) -> None:
        while not self._stopping.wait(self.every_s):
            self.tick()
