"""The conventions' database operation durations, from an engine gpufleet makes, on a real
PostgreSQL (and SQLite): each statement by the verb of what SQLAlchemy built, a failed one
by its SQLSTATE, and never a statement's text in a label."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, bindparam, column, delete, select, table
from sqlalchemy.exc import ProgrammingError

from gpufleet.common.db.engine import make_engine
from gpufleet.common.metrics.catalog import DB_CLIENT_OPERATION_DURATION
from tests.support.metrics import MetricsProbe, Series

DURATION = DB_CLIENT_OPERATION_DURATION.name
# A value only the statements' text and parameters hold: it must reach no label.
SECRET = "tenant-secret-7f3a"
# The semantic conventions' buckets for database operations, in seconds.
DB_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)


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
