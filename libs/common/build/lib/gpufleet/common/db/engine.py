"""Engines and sessions for PostgreSQL (production, integration tests) and SQLite (the
embedded default). Never hold a session across a provider or agent call: decide and
record intent, commit, call, then record the outcome in a new transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine with the per-dialect settings gpufleet relies on."""
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # Several processes share one file: WAL lets readers run beside the writer.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
            # pysqlite's own transaction handling must be off for BEGIN IMMEDIATE to work.
            dbapi_conn.isolation_level = None

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            # Take the write lock at BEGIN so read-then-write transactions serialise
            # instead of failing with "database is locked" on upgrade.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(
        url,
        pool_pre_ping=True,
        # A paused process must not hold row locks (e.g. the leader lease) forever.
        connect_args={"options": "-c idle_in_transaction_session_timeout=30000"},
        **kwargs,
    )


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One short transaction: commit on success, roll back on any error."""
    with factory() as session, session.begin():
        yield session
