"""The bounded pool of workers that makes the fleet tick's network calls.

The tick decides and records intent, then hands each provider call and each agent
dispatch to this pool and returns: a slow or hung cloud, or an agent whose StartJob
hangs, delays only its own machine. Every call has a key (``create:<machine>``,
``dispatch:<attempt>``); a key already in flight is not submitted again, so a tick that
sees a call still pending never starts it twice. Across a leader change the key lives on
in the database (the machine's ``pending_call``), and the drivers are idempotent by
machine id, so the new leader re-issuing a call adopts what the old one started.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

log = logging.getLogger(__name__)


class CallPool:
    """At most ``workers`` calls at once; the rest wait in order."""

    def __init__(self, workers: int, name: str = "fleet-calls") -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._in_flight: dict[str, Future[None]] = {}
        self._idle = threading.Condition(self._lock)

    def submit(self, key: str, call: Callable[[], None]) -> bool:
        """Run ``call`` in the pool unless ``key`` is already in flight (then False)."""
        with self._lock:
            if key in self._in_flight:
                return False
            try:
                future = self._executor.submit(self._run, key, call)
            except RuntimeError:  # shut down
                return False
            self._in_flight[key] = future
            return True

    def _run(self, key: str, call: Callable[[], None]) -> None:
        try:
            call()
        except Exception:
            # Each call records its own outcome; one that raised anyway is logged and
            # its transitional state stays visible for the watchdogs.
            log.exception("call %s failed", key)
        finally:
            with self._lock:
                self._in_flight.pop(key, None)
                self._idle.notify_all()

    def in_flight(self, key: str) -> bool:
        with self._lock:
            return key in self._in_flight

    def pending(self) -> int:
        with self._lock:
            return len(self._in_flight)

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until no call is in flight (for tests and orderly shutdown)."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._in_flight, timeout=timeout_s)

    def close(self, wait: bool = False) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=True)
