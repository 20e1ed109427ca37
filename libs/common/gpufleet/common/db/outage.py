"""The database going away (a PostgreSQL restart, a failover, a standby answering
read-only), told apart from every other database error, and watched.

Services meet it in three places, and each must answer it differently from a bug:

- a gRPC call: UNAVAILABLE with reason ``DATABASE_UNAVAILABLE`` and a RetryInfo (this
  module registers the translation the server skeleton applies), never INTERNAL;
- the health check: NOT_SERVING while this process cannot write, SERVING again after
  (:class:`DatabaseWatch` probes and tells its listeners);
- the leader's loops: they wait with back-off instead of dying, the lease starts a new
  term before anything read before the outage is written, and the passes hold back until
  the fleet has had time to report again (gpufleet.common.loops).

Only errors of the connection are an outage: a deadlock, a serialization failure, a
cancelled statement or a constraint is the caller's to handle, as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError

from gpufleet.common.clock import Clock
from gpufleet.common.errors import DatabaseUnavailable, translate_with

log = logging.getLogger(__name__)

# SQLSTATE classes and codes that mean "this server cannot serve this session now": the
# connection failed (08), the server is shutting down or starting (57P01-57P03), or it is
# a standby that cannot write (25006, after a failover that pointed here too early).
_OUTAGE_CLASSES = ("08",)
_OUTAGE_CODES = frozenset({"57P01", "57P02", "57P03", "25006"})


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` (or what it wraps) says the store is unreachable or read-only."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _says_outage(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _says_outage(error: BaseException) -> bool:
    if isinstance(error, DisconnectionError):
        return True
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    state = getattr(getattr(error, "orig", None), "sqlstate", None) or getattr(error, "sqlstate", None)
    if isinstance(state, str) and state:
        return state.startswith(_OUTAGE_CLASSES) or state in _OUTAGE_CODES
    if isinstance(error, OperationalError | InterfaceError):
        # No SQLSTATE: the client failed before the server answered (refused, reset,
        # timed out). SQLite's own errors ("database is locked") are not an outage.
        return type(error.orig).__module__.startswith("psycopg")
    module = type(error).__module__
    return module.startswith("psycopg") and type(error).__name__ in ("OperationalError", "InterfaceError")


def describe(error: BaseException) -> str:
    """What failed, in one line (the driver's own words, without SQLAlchemy's trailer)."""
    lines = str(getattr(error, "orig", None) or error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def unavailable(error: BaseException) -> DatabaseUnavailable:
    """The error a caller is answered with for an outage."""
    return DatabaseUnavailable(f"the database is unavailable ({describe(error)}); retry shortly")


def _as_unavailable(error: BaseException) -> DatabaseUnavailable | None:
    return unavailable(error) if is_outage(error) else None


# The server skeleton answers an outage UNAVAILABLE through this (it imports no database
# library: the provisioner and the agent run it too).
translate_with(_as_unavailable)


Listener = Callable[[bool], None]


class DatabaseWatch:
    """Whether this process can write to its store now, kept by a probe of its own.

    It probes every ``probe_every_s`` real seconds while the store answers, and at once
    when any statement of the engine fails as an outage; while it does not answer, it
    probes with a doubling back-off up to ``max_backoff_s``. Listeners hear each change
    (True: writable again); :attr:`recovered_at` is the clock time of the last return.
    Real seconds, not clock seconds: reaching a server is a matter of the network."""

    def __init__(
        self,
        engine: Engine,
        clock: Clock,
        *,
        probe_every_s: float = 2.0,
        first_backoff_s: float = 0.25,
        max_backoff_s: float = 5.0,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.probe_every_s = probe_every_s
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self.up = True
        self.recovered_at: datetime | None = None
        self.outages = 0
        self.last_error = ""
        self._listeners: list[Listener] = []
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        event.listen(engine, "handle_error", self._statement_failed)

    def on_change(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="database-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if event.contains(self.engine, "handle_error", self._statement_failed):
            event.remove(self.engine, "handle_error", self._statement_failed)

    def suspect(self) -> None:
        """Someone saw an outage: probe now rather than at the next period."""
        self._wake.set()

    def _statement_failed(self, context: object) -> None:
        error = getattr(context, "original_exception", None)
        if getattr(context, "is_disconnect", False) or (error is not None and is_outage(error)):
            self.suspect()

    def probe(self) -> str | None:
        """One look: None when the store answers and can write, else why not."""
        try:
            with self.engine.connect() as conn:
                if self.engine.dialect.name == "postgresql":
                    # A standby answers reads: only a writable server counts.
                    if conn.execute(text("SHOW transaction_read_only")).scalar() == "on":
                        return "the server is read-only (a standby)"
                else:
                    conn.execute(text("SELECT 1"))
        except Exception as exc:
            return describe(exc)
        return None

    def _run(self) -> None:
        backoff = self.first_backoff_s
        while not self._stop.is_set():
            why = self.probe()
            if why is None:
                backoff = self.first_backoff_s
                if not self.up:
                    self._changed(True, "")
            else:
                backoff = backoff if self.up else min(backoff * 2, self.max_backoff_s)
                if self.up or why != self.last_error:
                    self._changed(False, why)
            self._wake.wait(self.probe_every_s if self.up else backoff)
            self._wake.clear()

    def _changed(self, up: bool, why: str) -> None:
        was_up = self.up
        self.last_error = why
        self.up = up
        if up:
            self.recovered_at = self.clock.now()
            log.warning("the database answers again; serving", extra={"fields": {"outages": self.outages}})
        elif was_up:
            self.outages += 1
            log.warning(
                "the database is unavailable (%s); not serving, retrying with back-off",
                why,
                extra={"fields": {"outages": self.outages}},
            )
        if up == was_up:
            return
        for listener in self._listeners:
            try:
                listener(up)
            except Exception:
                log.exception("a listener of the database's state failed")
