"""The reaper's own bounded pool for its provider calls (stop, destroy).

A net's pass claims a machine — intent and transitional state, and a detection's ledger
row, committed in one fenced transaction — then hands the call and the recording of its
answer to this pool and goes on to its next machine. So a slow or hung provider delays
only its own machine: never the idle scanner's samples, the boot-failure probes (each has
its own pool), another net's pass, or another machine's stop or destroy, up to
``workers`` at once; the rest wait their turn, each machine already visibly transitional.

Every call has a key, the transition's idempotency key (``stop:<machine>:<since>``); a
key already in flight is not submitted again, and :meth:`ProviderCalls.busy` says whether
any call for a machine is still in flight here — which the stuck-transition net reads
before it reads the provider or re-issues the same call. Nothing here outlives the
process: a call whose answer is lost (a crash, a leader change) leaves its machine
transitional, the stuck-transition net's case.

What a call did is counted into its net's next pass (:class:`Answers`): the pass that
asked has already returned.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from gpufleet.common.errors import Fenced
from gpufleet.common.loops import TickReport

log = logging.getLogger(__name__)


class ProviderCalls:
    """At most ``workers`` provider calls at once; the rest wait in order."""

    def __init__(self, workers: int = 16) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="provider-calls")
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._in_flight: dict[str, tuple[str, Future[None]]] = {}
        self._machines: Counter[str] = Counter()
        self._draining = False

    @property
    def accepting(self) -> bool:
        """False once the reaper is stopping: a net claims nothing a call could not follow."""
        with self._lock:
            return not self._draining

    def submit(self, machine_id: str, key: str, call: Callable[[], None]) -> bool:
        """Run ``call`` in the pool unless ``key`` is already in flight or the pool is closed
        (then False)."""
        with self._lock:
            if key in self._in_flight:
                return False
            try:
                future = self._executor.submit(self._run, key, call)
            except RuntimeError:  # closed
                return False
            self._in_flight[key] = (machine_id, future)
            self._machines[machine_id] += 1
            return True

    def _run(self, key: str, call: Callable[[], None]) -> None:
        try:
            call()
        except Fenced as err:
            # Leadership moved on while the call was out: its answer is not ours to write.
            log.warning("%s: outcome not recorded (%s); the stuck-transition net reads it afresh", key, err)
        except Exception:
            # Each call records its own outcome; one that raised anyway leaves its machine
            # transitional, visible to the stuck-transition net.
            log.exception("provider call %s failed unexpectedly", key)
        finally:
            self._forget(key)

    def _forget(self, key: str) -> None:
        with self._lock:
            entry = self._in_flight.pop(key, None)
            if entry is not None:
                self._machines[entry[0]] -= 1
                if self._machines[entry[0]] <= 0:
                    del self._machines[entry[0]]
            self._idle.notify_all()

    def busy(self, machine_id: str) -> bool:
        """Whether a call for ``machine_id`` is running or waiting here."""
        with self._lock:
            return machine_id in self._machines

    def pending(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def settle(self, timeout_s: float | None = None) -> bool:
        """Block until no call is in flight (tests, shutdown); False if the wait ran out."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._in_flight, timeout=timeout_s)

    def drain(self, timeout_s: float) -> bool:
        """Stop taking new claims and wait (real seconds) for the calls in flight, so that
        they record their answers while this replica still holds the lease."""
        with self._lock:
            self._draining = True
        return self.settle(timeout_s)

    def close(self) -> None:
        """Cancel what has not started; a call still running is cut off when the
        provisioner's channel closes, and its machine stays transitional."""
        with self._lock:
            self._draining = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            unsent = [key for key, (_, future) in self._in_flight.items() if future.cancelled()]
        for key in unsent:
            self._forget(key)
        if unsent:
            log.warning(
                "%d provider calls never sent; their machines stay transitional for the stuck-transition net",
                len(unsent),
                extra={"fields": {"unsent": unsent}},
            )


class Answers:
    """What one net's calls did after its pass returned, for the net's next pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._report = TickReport()

    def add(self, report: TickReport) -> None:
        with self._lock:
            self._report.actions.update(report.actions)
            self._report.refusals.update(report.refusals)

    def take(self) -> TickReport:
        """Everything counted since the last take (the next pass's report starts from it)."""
        with self._lock:
            report, self._report = self._report, TickReport()
        return report
