"""A bounded pool of workers for the network calls a timer-driven pass hands off, and the
counts of what those calls did, for the pass after.

A pass (the scheduler's fleet tick, a reaper net) decides and records its intent, then
hands each provider or agent call to a :class:`CallPool` and returns: a slow or hung cloud
or agent delays only its own machine. Every call has a key (``create:<machine>``,
``dispatch:<attempt>``, a transition's idempotency key); a key already in flight is not
submitted again, so a pass that sees a call still pending never starts it twice. A call may
name a group (its machine), so a pass can ask whether anything for that machine is still in
flight here. Each service keeps one pool per kind of call — provider calls apart from agent
calls — so that one kind can never hold up the other.

What a call did is counted in :class:`Outcomes` and drained into the next pass's report:
the pass that asked has already returned.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from gpufleet.common.db.outage import describe, is_outage
from gpufleet.common.errors import Fenced
from gpufleet.common.loops import TickReport

log = logging.getLogger(__name__)


class CallPool:
    """At most ``workers`` calls at once; the rest wait in order."""

    def __init__(self, workers: int, name: str = "calls") -> None:
        self.name = name
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight: dict[str, tuple[str | None, Future[None]]] = {}
        self._groups: Counter[str] = Counter()
        self._draining = False

    @property
    def accepting(self) -> bool:
        """False once the pool is draining or closed: a pass should claim nothing a call
        could not follow."""
        with self._lock:
            return not self._draining

    def submit(self, key: str, call: Callable[[], None], group: str | None = None) -> bool:
        """Run ``call`` in the pool unless ``key`` is already in flight or the pool is closed
        (then False)."""
        with self._lock:
            if key in self._in_flight:
                return False
            try:
                future = self._executor.submit(self._run, key, call)
            except RuntimeError:  # closed
                return False
            self._in_flight[key] = (group, future)
            if group is not None:
                self._groups[group] += 1
            return True

    def _run(self, key: str, call: Callable[[], None]) -> None:
        try:
            call()
        except Fenced as err:
            # Leadership moved on while the call was out: its answer is not ours to write.
            log.warning("%s: outcome not recorded by a deposed leader (%s)", key, err)
        except Exception as err:
            if is_outage(err):
                # The database went away while the call was out: its outcome stays
                # unwritten, the state transitional, for the watchdogs (or the machine's
                # own reports) once it is back. A known condition: one line, no stack.
                log.warning(
                    "call %s: outcome not recorded, the database is unavailable (%s)", key, describe(err)
                )
                return
            # Each call records its own outcome; one that raised anyway is logged and its
            # transitional state stays visible for the watchdogs.
            log.exception("call %s failed", key)
        finally:
            self._forget(key)

    def _forget(self, key: str) -> None:
        with self._lock:
            entry = self._in_flight.pop(key, None)
            if entry is not None and entry[0] is not None:
                self._groups[entry[0]] -= 1
                if self._groups[entry[0]] <= 0:
                    del self._groups[entry[0]]
            self._idle.notify_all()

    def in_flight(self, key: str) -> bool:
        with self._lock:
            return key in self._in_flight

    def busy(self, group: str) -> bool:
        """Whether a call of ``group`` (a machine) is running or waiting here."""
        with self._lock:
            return group in self._groups

    def pending(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until no call is in flight (tests, orderly shutdown); False if the wait ran
        out."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._in_flight, timeout=timeout_s)

    def drain(self, timeout_s: float) -> bool:
        """Take no new call and wait (real seconds) for those in flight, so that they record
        their answers while this replica still holds its lease."""
        with self._lock:
            self._draining = True
        return self.wait_idle(timeout_s)

    def close(self) -> None:
        """Cancel what has not started (said in the log); a call still running is cut off
        when its channel closes, and its machine stays transitional for the watchdogs."""
        with self._lock:
            self._draining = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            unsent = [key for key, (_, future) in self._in_flight.items() if future.cancelled()]
        for key in unsent:
            self._forget(key)
        if unsent:
            log.warning(
                "%s: %d calls never sent; their machines stay transitional for the watchdogs",
                self.name,
                len(unsent),
                extra={"fields": {"unsent": unsent}},
            )


class Outcomes:
    """What a pass's calls did after it returned, counted for the next pass's report."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._report = TickReport()

    def add(self, what: str, count: int = 1) -> None:
        with self._lock:
            self._report.actions[what] += count

    def add_report(self, report: TickReport) -> None:
        with self._lock:
            self._report.actions.update(report.actions)
            self._report.refusals.update(report.refusals)

    def take(self) -> TickReport:
        """Everything counted since the last take."""
        with self._lock:
            report, self._report = self._report, TickReport()
        return report

    def drain_into(self, report: TickReport) -> None:
        taken = self.take()
        report.actions.update(taken.actions)
        report.refusals.update(taken.refusals)
