"""Engines and sessions for PostgreSQL (production, integration tests) and SQLite (the
embedded default). Never hold a session across a provider or agent call: decide and
record intent, commit, call, then record the outcome in a new transaction.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

# Imported for its registration: every process with an engine answers the database's
# loss as UNAVAILABLE (see gpufleet.common.db.outage).
from gpufleet.common.db import outage as _outage  # noqa: F401
from gpufleet.common.db.operation_durations import record_operation_durations
from gpufleet.common.metrics.instruments import PROCESS, Instruments


def make_engine(url: str, *, instruments: Instruments = PROCESS, **kwargs: Any) -> Engine:
    """An engine with the per-dialect settings gpufleet relies on, each statement's
    duration recorded through ``instruments`` (``db.client.operation.duration``)."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **kwargs)
        record_operation_durations(engine, instruments)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # Several processes share one file: WAL lets readers run beside the writer.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            # In WAL mode NORMAL syncs at checkpoints, not at every commit: a commit
            # survives a crash of any gpufleet process (only a power loss can take back the
            # last few), and writers no longer queue behind one fsync each.
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
            # pysqlite's own transaction handling must be off for BEGIN IMMEDIATE to work.
            dbapi_conn.isolation_level = None

        # Writers of this process queue on a lock of their own, in order, before they
        # take SQLite's: SQLite's busy handler retries by sleeping (up to 100 ms a try),
        # so threads contending for the file waited hundreds of milliseconds each. The
        # busy timeout still orders this process against the others sharing the file.
        writer = threading.Lock()
        _WRITERS[engine] = writer

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            # Take the write lock at BEGIN so read-then-write transactions serialise
            # instead of failing with "database is locked" on upgrade.
            writer.acquire()
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            except BaseException:
                writer.release()
                raise
            conn.info["gpufleet_writer"] = True

        def _release(conn: Any) -> None:
            if conn.info.pop("gpufleet_writer", False):
                writer.release()

        event.listen(engine, "commit", _release)
        event.listen(engine, "rollback", _release)

        return engine
    kwargs.setdefault("pool_size", 20)
    kwargs.setdefault("max_overflow", 20)
    engine = create_engine(
        url,
        # Connections are opened lazily; keeping up to 20 open means a burst of API calls
        # (32 server threads) reuses them instead of opening and closing a PostgreSQL
        # connection per call beyond the pool (profiled: 6 % of SubmitJob's time at 5+10).
        connect_args={
            # A paused process must not hold row locks (e.g. the leader lease) forever.
            "options": "-c idle_in_transaction_session_timeout=30000",
            # A server that vanished without a word (a failover moving its address, a
            # partition) must fail a connect or a statement in seconds, not at the
            # kernel's TCP timeout, so callers get UNAVAILABLE and the health check says
            # NOT_SERVING (gpufleet.common.db.outage): connect within 5 s; a silent peer
            # is given up after 20 s of unacknowledged data, or 10 + 3 x 3 s of unanswered
            # keepalives when idle.
            "connect_timeout": 5,
            "tcp_user_timeout": 20000,
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 3,
            "keepalives_count": 3,
        },
        **kwargs,
    )
    _ping_when_idle(engine)
    record_operation_durations(engine, instruments)
    return engine


PING_IDLE_S = 10.0
# Each SQLite engine's writer lock, for the writers that go around the engine
# (gpufleet.common.db.statements.SqliteWriter): one queue for every writer of a process.
_WRITERS: weakref.WeakKeyDictionary[Engine, threading.Lock] = weakref.WeakKeyDictionary()


def writer_lock(engine: Engine) -> threading.Lock:
    """The lock this process's writers of a SQLite engine queue on (see make_engine)."""
    return _WRITERS[engine]


def _ping_when_idle(engine: Engine) -> None:
    """Pre-ping, but only a connection that sat idle in the pool for ``PING_IDLE_S``: one
    just returned by a busy thread is alive, and pinging it cost a round trip per call
    (profiled: 15 % of SubmitJob's time). A stale one is pinged and, if the server has
    gone (a restart, a failover), replaced before the caller sees it."""

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn: Any, record: Any) -> None:
        record.info["returned_at"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        returned = record.info.get("returned_at")
        if returned is not None and time.monotonic() - returned < PING_IDLE_S:
            return
        try:
            with dbapi_conn.cursor() as cur:
                cur.execute("SELECT 1")
            dbapi_conn.rollback()
        except Exception as exc:  # the connection is dead: the pool opens a fresh one
            raise DisconnectionError(str(exc)) from exc


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One short transaction: commit on success, roll back on any error."""
    with factory() as session, session.begin():
        yield session
