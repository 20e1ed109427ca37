"""The conventions' database operation durations, from an engine gpufleet makes, on a real
PostgreSQL (and SQLite): each statement by the verb of what SQLAlchemy built, a failed one
by its SQLSTATE, and never a statement's text in a label. The statements that go around
the engine's events (SubmitJob's, a bulk insert's COPY) are timed the same way, through
the engine's instruments, by the verb their code gives."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import (
    Column,
    Integer,
    MetaData,
    String,
    Table,
    bindparam,
    column,
    delete,
    func,
    select,
    table,
    text,
)
from sqlalchemy.exc import ProgrammingError

from gpufleet.common.catalog import load_catalog
from gpufleet.common.clock import ManualClock
from gpufleet.common.db.bulk import insert_rows
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.statements import SqliteWriter, StatementPool
from gpufleet.common.metrics.catalog import DB_CLIENT_OPERATION_DURATION
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.job_service import JobService
from gpufleet.v1 import job_pb2, job_service_pb2
from tests.support import tls
from tests.support.metrics import MetricsProbe, Series

DURATION = DB_CLIENT_OPERATION_DURATION.name
# A value only the statements' text and parameters hold: it must reach no label.
SECRET = "tenant-secret-7f3a"
# The semantic conventions' buckets for database operations, in seconds.
DB_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
NOW = datetime(2026, 12, 3, 8, 15, tzinfo=UTC)


@pytest.fixture
def probe() -> Iterator[MetricsProbe]:
    probe = MetricsProbe()
    yield probe
    probe.close()


def labels(system: str, operation: str | None = None, failure: str | None = None) -> Series:
    """A series' labels; ``failure`` is the code the database answered, which the
    conventions put in both error.type and db.response.status_code."""
    found = {"db.system.name": system}
    if operation is not None:
        found["db.operation.name"] = operation
    if failure is not None:
        found["error.type"] = found["db.response.status_code"] = failure
    return tuple(sorted(found.items()))


def test_each_statement_is_timed_by_its_verb_and_a_failure_by_its_sqlstate(
    pg_url: str, probe: MetricsProbe
) -> None:
    engine = make_engine(pg_url, instruments=probe.instruments)
    notes = Table(
        "duration_probe",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("note", String),
        prefixes=["TEMPORARY"],
    )
    try:
        with engine.begin() as conn:
            notes.create(conn, checkfirst=False)  # DDL: timed, with no operation name
            conn.execute(notes.insert().values(id=1, note=SECRET))
            conn.execute(notes.insert().values(id=2, note="other"))
            conn.execute(
                notes.update().where(notes.c.id == bindparam("b_id")).values(note=bindparam("b_note")),
                [{"b_id": 1, "b_note": SECRET}, {"b_id": 2, "b_note": SECRET}],
            )
            found = conn.execute(select(notes.c.id).where(notes.c.note == SECRET)).scalars().all()
            conn.execute(delete(notes).where(notes.c.id == 2))
        with pytest.raises(ProgrammingError), engine.connect() as conn:
            conn.execute(select(table("no_such_table", column("note"))).where(column("note") == SECRET))
    finally:
        engine.dispose()

    assert sorted(found) == [1, 2]
    assert probe.series(DURATION) == {
        labels("postgresql"): 1,
        labels("postgresql", "INSERT"): 2,
        labels("postgresql", "BATCH UPDATE"): 1,
        labels("postgresql", "SELECT"): 1,
        labels("postgresql", "DELETE"): 1,
        labels("postgresql", "SELECT", failure="42P01"): 1,  # undefined_table
    }
    for series, point in probe.points(DURATION).items():
        assert not any(word in value for _, value in series for word in (SECRET, "duration_probe", "FROM"))
        assert point.sum > 0
        assert tuple(point.explicit_bounds) == DB_BUCKETS


def test_sqlite_statements_are_timed_as_sqlite(sqlite_url: str, probe: MetricsProbe) -> None:
    engine = make_engine(sqlite_url, instruments=probe.instruments)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(1)).scalar() == 1
            with pytest.raises(Exception, match="no such table"):
                conn.execute(select(table("no_such_table", column("note"))))
    finally:
        engine.dispose()
    recorded = probe.series(DURATION)
    assert recorded[labels("sqlite", "SELECT")] == 1
    assert recorded[labels("sqlite", "SELECT", failure="SQLITE_ERROR")] == 1
    # Each transaction's BEGIN IMMEDIATE is the engine's own text SQL: timed, no verb read.
    assert set(recorded) <= {
        labels("sqlite"),
        labels("sqlite", "SELECT"),
        labels("sqlite", "SELECT", failure="SQLITE_ERROR"),
    }


# -- the statements that go around the engine's events --------------------------------------


def timed_with_a_verb(probe: MetricsProbe) -> dict[Series, float]:
    """The recorded series that carry an operation's name (the engine's own DDL and text
    SQL, timed without one, are left out)."""
    return {s: n for s, n in probe.series(DURATION).items() if "db.operation.name" in dict(s)}


def test_a_statement_on_the_statement_pool_is_timed_by_the_verb_its_caller_gives(
    pg_url: str, probe: MetricsProbe
) -> None:
    """SubmitJob's path on PostgreSQL: one prepared statement in autocommit (a
    data-modifying CTE like SubmitJob's), timed through the instruments of the engine the
    pool was made from, by the verb its caller gives and, failed, by its SQLSTATE."""
    engine = make_engine(pg_url, instruments=probe.instruments)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE duration_probe (id TEXT PRIMARY KEY, note TEXT)"))
        conn.execute(text("CREATE TABLE duration_probe_events (id TEXT, note TEXT)"))
    submit = text(
        "WITH j AS (INSERT INTO duration_probe (id, note) VALUES (:id, :note) RETURNING id)"
        " INSERT INTO duration_probe_events (id, note) SELECT id, 'submitted' FROM j RETURNING id"
    )

    async def statements() -> None:
        pool = StatementPool(engine, max_size=1)
        try:
            sql = pool.compile(submit)
            assert await pool.fetch_one(sql, {"id": "j-1", "note": SECRET}, operation="INSERT") == ("j-1",)
            with pytest.raises(psycopg.errors.UniqueViolation):
                await pool.fetch_one(sql, {"id": "j-1", "note": SECRET}, operation="INSERT")
            assert await pool.fetch_one(pool.compile(text("SELECT count(*) FROM duration_probe")), {}) == (1,)
        finally:
            await pool.aclose()

    try:
        asyncio.run(statements())
    finally:
        engine.dispose()
    recorded = probe.series(DURATION)
    assert timed_with_a_verb(probe) == {
        labels("postgresql", "INSERT"): 1,
        labels("postgresql", "INSERT", failure="23505"): 1,  # unique_violation
    }
    # The count given no verb is timed without one, as the engine times its text SQL (and
    # the two CREATE TABLEs).
    assert recorded[labels("postgresql")] == 3
    for series, point in probe.points(DURATION).items():
        assert not any(word in value for _, value in series for word in (SECRET, "duration_probe", "WITH"))
        assert point.sum > 0
        assert tuple(point.explicit_bounds) == DB_BUCKETS


def test_a_bulk_insert_s_copy_is_timed_as_copy(pg_url: str, probe: MetricsProbe) -> None:
    """The fleet tick's bulk inserts go in by COPY on the transaction's own connection:
    timed as the operation COPY, once for all its rows, and by its SQLSTATE when it fails."""
    engine = make_engine(pg_url, instruments=probe.instruments)
    notes = Table(
        "duration_probe",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("note", String),
        Column("kind", String, default="plain"),
    )
    try:
        with engine.begin() as conn:
            notes.create(conn)
        with engine.begin() as conn:
            insert_rows(conn, notes, [{"id": n, "note": SECRET} for n in range(500)])
        with pytest.raises(psycopg.errors.UniqueViolation), engine.begin() as conn:
            insert_rows(conn, notes, [{"id": 7, "note": SECRET}])
        with engine.connect() as conn:
            stored = conn.execute(
                select(func.count()).select_from(notes).where(notes.c.kind == "plain")
            ).scalar()
    finally:
        engine.dispose()
    assert stored == 500
    copies = {
        labels("postgresql", "COPY"): 1,
        labels("postgresql", "COPY", failure="23505"): 1,
    }
    assert {s: n for s, n in timed_with_a_verb(probe).items() if s in copies} == copies


def test_a_statement_on_the_sqlite_writer_is_timed_by_the_verb_its_caller_gives(
    sqlite_url: str, probe: MetricsProbe
) -> None:
    """SubmitJob's path on SQLite: statements on the kept writer connection, each timed
    through the engine's instruments, a failed one by SQLite's error name."""
    engine = make_engine(sqlite_url, instruments=probe.instruments)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE duration_probe (id TEXT PRIMARY KEY, note TEXT)"))
    writer = SqliteWriter(engine)
    insert_note = "INSERT INTO duration_probe (id, note) VALUES (:id, :note)"
    try:
        with writer.transaction() as conn:
            conn.execute(insert_note, {"id": "j-1", "note": SECRET}, operation="INSERT")
            assert conn.execute("SELECT note FROM duration_probe").fetchone() == (SECRET,)
        with pytest.raises(sqlite3.IntegrityError), writer.transaction() as conn:
            conn.execute(insert_note, {"id": "j-1", "note": SECRET}, operation="INSERT")
    finally:
        writer.close()
        engine.dispose()
    assert timed_with_a_verb(probe) == {
        labels("sqlite", "INSERT"): 1,
        labels("sqlite", "INSERT", failure="SQLITE_CONSTRAINT_PRIMARYKEY"): 1,
    }
    # The SELECT given no verb is timed without one, beside the engine's own text SQL.
    assert probe.series(DURATION)[labels("sqlite")] >= 1


def test_submit_job_s_own_statements_are_timed(db_url: str, probe: MetricsProbe) -> None:
    """The real SubmitJob, awaited on a loop of its own thread as the server's are: its
    write (one statement on PostgreSQL, three on SQLite) is timed through the instruments
    of the engine the service was given, and nothing else ran."""
    seeding = make_engine(db_url)
    with make_sessionmaker(seeding)() as session, session.begin():
        sync_catalog(session, load_catalog(None))
    seeding.dispose()
    engine = make_engine(db_url, instruments=probe.instruments)
    jobs = JobService(make_sessionmaker(engine), ManualClock(NOW), tls.transport("scheduler"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    submitted = job_service_pb2.SubmitJobRequest(
        request_id="timed-1",
        job=job_pb2.Job(workspace="acme-studio", pool="l4", kind="short_episode", pipeline_version="v1"),
    )
    try:
        job = asyncio.run_coroutine_threadsafe(jobs.SubmitJob(submitted, None), loop).result(60)  # type: ignore[arg-type]
    finally:
        jobs.close()  # while the loop runs: the statement pool closes on it
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        engine.dispose()
    assert job.state == job_pb2.JOB_STATE_QUEUED
    system = "postgresql" if db_url.startswith("postgresql") else "sqlite"
    recorded = probe.series(DURATION)
    # PostgreSQL: one INSERT (the catalogue check rides in it); SQLite: the catalogue check,
    # then the job's and its event's INSERTs — each named by the service, which knows its verb.
    expected = {"INSERT": 1} if system == "postgresql" else {"SELECT": 1, "INSERT": 2}
    assert {dict(series)["db.operation.name"]: n for series, n in recorded.items()} == expected
    assert all(dict(series)["db.system.name"] == system for series in recorded)
