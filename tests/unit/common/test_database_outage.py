"""Which database errors are the database's loss (answered UNAVAILABLE, waited out) and
which are the caller's to handle as before — from the drivers' own classes and SQLSTATEs,
never from their messages."""

from __future__ import annotations

import sqlite3

import grpc
import psycopg
import pytest
from psycopg import errors as pg
from sqlalchemy import exc as sa

from gpufleet.common.db.outage import is_outage
from gpufleet.common.errors import DatabaseUnavailable, translated


def wrapped(orig: Exception, cls: type[sa.DBAPIError] = sa.OperationalError) -> sa.DBAPIError:
    """As SQLAlchemy raises a driver's error: wrapped, the driver's as ``orig``."""
    try:
        raise cls("SELECT 1", {}, orig) from orig
    except sa.DBAPIError as err:
        return err


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        # The server refused or dropped the connection: no SQLSTATE, a driver error.
        (wrapped(psycopg.OperationalError("connection refused")), True),
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
        (wrapped(psycopg.InterfaceError("the connection is closed"), sa.InterfaceError), True),
        # The server says it is going or not there yet.
        (wrapped(pg.AdminShutdown("terminating connection due to administrator command")), True),
        (wrapped(pg.CrashShutdown("terminating connection because of crash")), True),
        (wrapped(pg.CannotConnectNow("the database system is starting up")), True),
        # A failover pointed here too early: a standby that cannot write.
        (wrapped(pg.ReadOnlySqlTransaction("read-only transaction"), sa.InternalError), True),
        (sa.DisconnectionError("pre-ping failed"), True),
        # The caller's: retried, reported or refused as before.
        (wrapped(pg.DeadlockDetected("deadlock detected")), False),
        (wrapped(pg.SerializationFailure("could not serialize")), False),
        (wrapped(pg.QueryCanceled("canceling statement due to statement timeout")), False),
        (wrapped(pg.UniqueViolation("duplicate key"), sa.IntegrityError), False),
        (wrapped(sqlite3.OperationalError("database is locked")), False),
        (ValueError("a bug"), False),
    ],
    ids=lambda v: type(getattr(v, "orig", v)).__name__ if not isinstance(v, bool) else str(v),
)
def test_an_outage_is_told_by_the_drivers_class_and_sqlstate(error: Exception, outage: bool) -> None:
    assert is_outage(error) is outage
    answer = translated(error)
    if outage:
        assert isinstance(answer, DatabaseUnavailable)
        assert (answer.code, answer.reason) == (grpc.StatusCode.UNAVAILABLE, "DATABASE_UNAVAILABLE")
        assert answer.message.startswith("the database is unavailable (")
        assert answer.retry_after_s is not None and answer.retry_after_s > 0
    else:
        assert answer is None
