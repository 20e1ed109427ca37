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
"""

from __future__ import annotations

import logging
import time
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

__all__ = ["operation_name", "record_operation_durations"]

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


def record_operation_durations(engine: Engine, instruments: Instruments = PROCESS) -> None:
    """Record ``db.client.operation.duration`` for every statement ``engine`` runs. A
    recording that fails never fails the statement (strict instruments, in tests, raise)."""
    durations = instruments.histogram(DB_CLIENT_OPERATION_DURATION)
    system = _SYSTEM_NAMES.get(engine.dialect.name, engine.dialect.name)

    def record(pending: tuple[float, str | None], failed: bool, error: BaseException | None) -> None:
        started, operation = pending
        try:
            labels = {DB_SYSTEM_NAME.key: system}
            if operation is not None:
                labels[DB_OPERATION_NAME.key] = operation
            if failed:
                labels.update(_failure_labels(error))
            durations.record(time.perf_counter() - started, labels)
        except Exception:
            if instruments.strict:
                raise
            log.exception("database operation duration not recorded")

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
            record(pending.pop(), False, None)

    @event.listens_for(engine, "handle_error")
    def _failed(failure: ExceptionContext) -> None:
        # Also called for failures outside a statement (a connect, a fetch): only one
        # handed to the driver and not returned is a failed operation.
        conn = failure.connection
        pending = conn.info.get(_PENDING) if conn is not None else None
        if pending:
            record(pending.pop(), True, failure.original_exception)
