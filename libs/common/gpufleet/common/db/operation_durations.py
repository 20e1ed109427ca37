"""How long each SQL statement took, as OpenTelemetry's semantic conventions define it
(``db.client.operation.duration``), from SQLAlchemy's own engine events.

Why gpufleet records it itself rather than through an instrumentation library:

- ``opentelemetry-instrumentation-sqlalchemy`` (0.66b2, the release matching the pinned
  OpenTelemetry) records no operation duration: spans, and a pool gauge under a name the
  conventions have since replaced (``db.client.connections.usage``, unit ``connections``,
  labelled with the engine's URL: host, port and database). Its own requirement stops at
  SQLAlchemy 2.0, where gpufleet runs 2.1.
- ``opentelemetry-instrumentation-psycopg`` records it (through the DB-API
  instrumentation) only when the process opts in with ``OTEL_SEMCONV_STABILITY_OPT_IN``,
  patches ``psycopg.connect`` for the whole process, makes a span per statement, reads
  the operation from the statement's first word, labels it with the server's address,
  and creates its instruments outside the catalogue. Its newest release on the index
  (0.66b1) pins an ``opentelemetry-instrumentation`` other than gpufleet's (0.66b2).

So :func:`record_operation_durations` listens on the engine: the clock starts when
SQLAlchemy hands the statement to the driver's cursor and stops when the cursor returns
(or fails). The labels follow the conventions, from values SQLAlchemy already holds:

- ``db.system.name``: the dialect (``postgresql``, ``sqlite``);
- ``db.operation.name``: the verb of the construct SQLAlchemy compiled (``SELECT``,
  ``INSERT``, ``UPDATE``, ``DELETE``; ``BATCH UPDATE`` for one executemany of several
  parameter sets), never read from the statement's text — so DDL and text SQL have none,
  as the conventions ask when the text may hold several operations;
- on a failure, ``error.type`` and ``db.response.status_code``: PostgreSQL's SQLSTATE or
  SQLite's error name, else the driver exception's class.

Never the statement's text (which would also be a series per distinct statement), nor the
server's address.

The statements that go around the engine's events (SubmitJob's, on
:class:`~gpufleet.common.db.statements.StatementPool` and
:class:`~gpufleet.common.db.statements.SqliteWriter`, and the COPY of
:func:`~gpufleet.common.db.bulk.insert_rows`) are timed by the same
:class:`OperationDurations` as the engine's, found by :func:`durations_of`: through the
instruments the engine was made with, under the same labels, the operation's name given
by the code that runs it (never read from its text).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Sequence
from typing import Any

from opentelemetry.semconv._incubating.attributes.db_attributes import (
    DbSystemNameValues as IncubatingDbSystemNames,
)
from opentelemetry.semconv.attributes.db_attributes import DbSystemNameValues
from sqlalchemy import CompoundSelect, Engine, Select, event
from sqlalchemy.engine import Connection, ExceptionContext, ExecutionContext

from gpufleet.common.metrics.catalog import (
    DB_CLIENT_OPERATION_DURATION,
    DB_OPERATION_NAME,
    DB_RESPONSE_STATUS_CODE,
    DB_SYSTEM_NAME,
    ERROR_TYPE,
)
from gpufleet.common.metrics.instruments import PROCESS, Instruments

__all__ = ["OperationDurations", "durations_of", "operation_name", "record_operation_durations"]

log = logging.getLogger(__name__)

# The conventions' names for the dialects gpufleet runs on (SQLite's is still incubating).
_SYSTEM_NAMES = {
    "postgresql": DbSystemNameValues.POSTGRESQL.value,
    "sqlite": IncubatingDbSystemNames.SQLITE.value,
}
# Per connection: the statements handed to the cursor and not yet returned, innermost last
# (SQLAlchemy's own recipe for timing statements keeps them on ``conn.info`` the same way).
_PENDING = "gpufleet.db.operations_pending"


def operation_name(context: ExecutionContext | None, executemany: bool, parameters: Any) -> str | None:
    """The SQL verb of the construct SQLAlchemy compiled, or None for DDL and text SQL."""
    if context is None:
        return None
    if context.isinsert:  # type: ignore[attr-defined]
        verb = "INSERT"
    elif context.isupdate:  # type: ignore[attr-defined]
        verb = "UPDATE"
    elif context.isdelete:  # type: ignore[attr-defined]
        verb = "DELETE"
    elif context.compiled is not None and isinstance(context.compiled.statement, Select | CompoundSelect):
        verb = "SELECT"
    else:
        return None
    several = executemany and isinstance(parameters, Sequence) and len(parameters) > 1
    return f"BATCH {verb}" if several else verb


def _failure_labels(error: BaseException | None) -> dict[str, str]:
    code = getattr(error, "sqlstate", None) or getattr(error, "sqlite_errorname", None)
    if isinstance(code, str) and code:
        return {ERROR_TYPE.key: code, DB_RESPONSE_STATUS_CODE.key: code}
    kind = type(error)
    return {ERROR_TYPE.key: f"{kind.__module__}.{kind.__qualname__}"}


class OperationDurations:
    """``db.client.operation.duration`` of one database system, through one set of
    instruments. A statement is timed from a ``time.perf_counter()`` its runner took just
    before handing it to the driver: :meth:`done` when the driver returned, :meth:`failed`
    when it raised. A recording that fails never fails the statement (strict instruments,
    in tests, raise)."""

    __slots__ = ("_histogram", "_ok", "_strict", "_system")

    def __init__(self, dialect: str, instruments: Instruments = PROCESS) -> None:
        self._histogram = instruments.histogram(DB_CLIENT_OPERATION_DURATION)
        self._strict = instruments.strict
        self._system = _SYSTEM_NAMES.get(dialect, dialect)
        # A succeeded operation's labels, made once per operation name (a handful).
        self._ok: dict[str | None, dict[str, str]] = {}

    def done(self, started: float, operation: str | None) -> None:
        elapsed = time.perf_counter() - started
        try:
            labels = self._ok.get(operation)
            if labels is None:
                labels = self._ok[operation] = self._labels(operation)
            self._histogram.record(elapsed, labels)
        except Exception:
            self._not_recorded()

    def failed(self, started: float, operation: str | None, error: BaseException | None) -> None:
        elapsed = time.perf_counter() - started
        try:
            self._histogram.record(elapsed, self._labels(operation) | _failure_labels(error))
        except Exception:
            self._not_recorded()

    def _labels(self, operation: str | None) -> dict[str, str]:
        labels = {DB_SYSTEM_NAME.key: self._system}
        if operation is not None:
            labels[DB_OPERATION_NAME.key] = operation
        return labels

    def _not_recorded(self) -> None:
        """Called while the recording's exception is handled."""
        if self._strict:
            raise
        log.exception("database operation duration not recorded")


# Each engine's durations, for the statements that run around its events.
_BY_ENGINE: weakref.WeakKeyDictionary[Engine, OperationDurations] = weakref.WeakKeyDictionary()


def durations_of(engine: Engine) -> OperationDurations:
    """The durations ``engine``'s statements are recorded through (see
    :func:`record_operation_durations`); for an engine not made by
    :func:`~gpufleet.common.db.engine.make_engine`, the process's instruments."""
    found = _BY_ENGINE.get(engine)
    if found is None:
        found = _BY_ENGINE[engine] = OperationDurations(engine.dialect.name)
    return found


def record_operation_durations(engine: Engine, instruments: Instruments = PROCESS) -> None:
    """Record ``db.client.operation.duration`` for every statement ``engine`` runs, and
    through the same instruments for the statements run around it (:func:`durations_of`).
    A recording that fails never fails the statement (strict instruments, in tests, raise)."""
    durations = _BY_ENGINE[engine] = OperationDurations(engine.dialect.name, instruments)

    @event.listens_for(engine, "before_cursor_execute")
    def _handed_to_driver(
        conn: Connection,
        _cursor: Any,
        _statement: str,
        parameters: Any,
        context: ExecutionContext | None,
        executemany: bool,
    ) -> None:
        operation = operation_name(context, executemany, parameters)
        conn.info.setdefault(_PENDING, []).append((time.perf_counter(), operation))

    @event.listens_for(engine, "after_cursor_execute")
    def _returned(
        conn: Connection, _cursor: Any, _statement: str, _parameters: Any, _context: Any, _many: bool
    ) -> None:
        pending = conn.info.get(_PENDING)
        if pending:
            durations.done(*pending.pop())

    @event.listens_for(engine, "handle_error")
    def _failed(failure: ExceptionContext) -> None:
        # Also called for failures outside a statement (a connect, a fetch): only one
        # handed to the driver and not returned is a failed operation.
        conn = failure.connection
        pending = conn.info.get(_PENDING) if conn is not None else None
        if pending:
            started, operation = pending.pop()
            durations.failed(started, operation, failure.original_exception)
