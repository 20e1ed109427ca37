"""A lean path for hot single-transaction writes: no ORM, no Core execution.

On PostgreSQL, :class:`StatementPool`: one statement, prepared, in autocommit, awaited on
the server's event loop.

Why: SubmitJob is one statement (a data-modifying CTE), and profiled, running it through
SQLAlchemy's engine cost about 0.21-0.24 ms of CPU a call (pool checkout and return
events, isolation-level set and reset, the result's metadata) against 0.08 ms for the
same statement on a psycopg connection of this pool, prepared once per connection and in
autocommit — about an eighth of all the CPU a SubmitJob costs the server. Awaited on the
event loop rather than run on a thread, it also spares the call its hop to a thread and
back, which under 16 callers cost more CPU than the statement itself (measured: 0.14 ms
a statement through threads, 0.085 ms awaited). Everything else in gpufleet stays on
SQLAlchemy; this is for statements that are the whole transaction.

The pool is psycopg's own (``psycopg_pool``). A connection the server dropped (a restart,
a failover) fails its statement with ``OperationalError``; the pool discards it on return
and the statement is tried once more on another connection, so callers must make their
statements safe to repeat (SubmitJob's is idempotent by ``request_id``). A database that
stays down is ``UNAVAILABLE`` to the caller, never ``INTERNAL``.

On SQLite, :class:`SqliteWriter`: one connection of the engine's pool kept for these
writes (the same pragmas), used under the engine's own writer lock — so these writers
queue in one line with every other writer of the process, as SQLite has one writer at a
time anyway — and values converted by the columns' own SQLAlchemy types, so what is
stored is exactly what the ORM would store and reads back the same. Profiled, SubmitJob's
three statements cost 0.05 ms this way against 0.44 ms through a session, and under 16
concurrent callers the session path spent over a millisecond more a call contending for
the engine's pool.

Going around the engine, these statements go around its events too: each is timed here
instead (``db.client.operation.duration``, through the engine's instruments, see
:func:`~gpufleet.common.db.operation_durations.durations_of`), from the hand-over to the
driver to its result. The operation's name is the caller's to give (``operation="INSERT"``):
the code that wrote a statement knows its verb, where its text (a data-modifying CTE, say)
may hold several; a statement given none is timed without one, as the engine times text SQL.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy import Engine, Table, TextClause

from gpufleet.common.db.engine import writer_lock
from gpufleet.common.db.operation_durations import OperationDurations, durations_of
from gpufleet.common.errors import DatabaseUnavailable

log = logging.getLogger(__name__)


class StatementPool:
    """Autocommit psycopg connections for single-statement transactions, used from one
    event loop: psycopg's async pool belongs to the loop it was opened on, so it opens on
    the loop of its first statement (the server's) and is closed there too."""

    def __init__(self, engine: Engine, *, max_size: int = 8, timeout_s: float = 30.0) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError("StatementPool is for PostgreSQL")
        self._dialect = engine.dialect
        self._timeout_s = timeout_s
        self._max_size = max_size
        self._durations = durations_of(engine)
        self._conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._opening: asyncio.Task[AsyncConnectionPool[psycopg.AsyncConnection[Any]]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def compile(self, statement: TextClause) -> str:
        """The statement in psycopg's parameter style (``%(name)s``), compiled once."""
        return str(statement.compile(dialect=self._dialect))

    async def fetch_one(
        self, sql: str, params: Mapping[str, Any], *, operation: str | None = None
    ) -> tuple[Any, ...] | None:
        """Run ``sql`` (from :meth:`compile`) as its own transaction; its first row.
        ``operation`` is its verb (``INSERT``), for its duration's labels."""
        pool = await self._opened()
        durations = self._durations
        for attempt in (1, 2):
            try:
                async with pool.connection(timeout=self._timeout_s) as conn:
                    started = time.perf_counter()
                    try:
                        cursor = await conn.execute(sql, params)  # type: ignore[arg-type]
                    except Exception as err:
                        durations.failed(started, operation, err)
                        raise
                    durations.done(started, operation)
                    return await cursor.fetchone()
            except psycopg.OperationalError as err:
                if attempt == 2:
                    raise DatabaseUnavailable(f"database unavailable: {err}") from err
                log.info("statement failed on a dropped connection; retrying on another: %s", err)
            except PoolTimeout as err:
                raise DatabaseUnavailable(f"no database connection within {self._timeout_s:.0f}s") from err
        raise AssertionError("unreachable")

    async def _opened(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        if self._pool is not None:
            return self._pool
        if self._opening is None:
            self._loop = asyncio.get_running_loop()
            self._opening = self._loop.create_task(self._open())
        # Shielded: a first caller that gives up must not cancel the opening for the rest.
        return await asyncio.shield(self._opening)

    async def _open(self) -> AsyncConnectionPool[psycopg.AsyncConnection[Any]]:
        pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=self._max_size,
            kwargs={"autocommit": True, "prepare_threshold": 0},
            open=False,
            name="gpufleet-statements",
        )
        await pool.open(wait=False)
        self._pool = pool
        return pool

    async def aclose(self) -> None:
        """Close the pool, on its own loop."""
        opening, self._opening = self._opening, None
        self._pool = None
        if opening is not None:
            await (await opening).close()

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the pool from another thread: on its loop while that still runs, or by
        running the stopped loop (a server's, after its stop) until the pool is closed."""
        loop = self._loop
        if self._opening is None or loop is None or loop.is_closed():
            return
        if loop.is_running():
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout_s)
        else:
            loop.run_until_complete(self.aclose())


class TimedStatements:
    """A :class:`SqliteWriter` transaction's connection, as its statements see it: each
    ``execute`` is timed."""

    __slots__ = ("_conn", "_durations")

    def __init__(self, conn: sqlite3.Connection, durations: OperationDurations) -> None:
        self._conn = conn
        self._durations = durations

    def execute(
        self,
        sql: str,
        parameters: Mapping[str, Any] | Sequence[Any] = (),
        *,
        operation: str | None = None,
    ) -> sqlite3.Cursor:
        """``sql`` run up to its first row (an ``INSERT ... RETURNING`` has inserted);
        ``operation`` is its verb (``INSERT``), for its duration's labels."""
        started = time.perf_counter()
        try:
            cursor = self._conn.execute(sql, parameters)
        except Exception as err:
            self._durations.failed(started, operation, err)
            raise
        self._durations.done(started, operation)
        return cursor


class SqliteWriter:
    """Write transactions on one kept SQLite connection, in the engine's writer queue."""

    def __init__(self, engine: Engine) -> None:
        if engine.dialect.name != "sqlite":
            raise ValueError("SqliteWriter is for SQLite")
        self._dialect = engine.dialect
        self._lock = writer_lock(engine)
        self._kept = engine.raw_connection()
        conn = self._kept.driver_connection
        assert isinstance(conn, sqlite3.Connection)
        self._conn = conn
        self._statements = TimedStatements(conn, durations_of(engine))

    def processors(self, table: Table) -> dict[str, Callable[[Any], Any]]:
        """Each column's bind conversion (datetimes to SQLite's text, JSON to text, ...)."""
        found: dict[str, Callable[[Any], Any]] = {}
        for column in table.columns:
            process = column.type.dialect_impl(self._dialect).bind_processor(self._dialect)
            if process is not None:
                found[column.key] = process
        return found

    @contextmanager
    def transaction(self) -> Iterator[TimedStatements]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any error), lock held. The
        statements run through what it yields are timed; the transaction's own control
        statements are not (nor is the engine's ``COMMIT``)."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._statements
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        self._kept.close()
