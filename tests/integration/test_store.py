"""The schema on both stores: migrations, the append-only ledger, leader fencing."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError

from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.statements import StatementPool
from gpufleet.common.errors import Fenced, Unavailable
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import record_failure
from gpufleet.common.loops import PeriodicTask, Ticker, TickReport
from tests.support.postgres import free_port


def test_ledger_refuses_update_and_delete(db_url: str) -> None:
    sessions = make_sessionmaker(make_engine(db_url))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    with sessions() as s, s.begin():
        row = record_failure(s, now, "went_silent", "went_silent", machine_id="m1", details="quiet")
        row_id = row.id
    for sql in ("UPDATE failures SET details = 'edited'", "DELETE FROM failures"):
        with pytest.raises(DBAPIError, match="append-only"), sessions() as s, s.begin():
            s.execute(text(sql))
    with sessions() as s:
        details = s.execute(text("SELECT details FROM failures WHERE id = :i"), {"i": row_id}).scalar()
    assert details == "quiet"


def test_one_leader_and_a_paused_leader_is_fenced(db_url: str) -> None:
    clock = ManualClock()
    sessions = make_sessionmaker(make_engine(db_url))
    a = LeaderLease("scheduler", "a", clock, sessions, ttl_s=15)
    b = LeaderLease("scheduler", "b", clock, sessions, ttl_s=15)
    assert a.try_acquire() is True
    assert b.try_acquire() is False
    # a is "paused" past its lease: b takes over with a higher epoch.
    clock.advance(timedelta(seconds=16))
    assert b.try_acquire() is True
    assert b.epoch == 2
    # a wakes with its old epoch in memory: its write is refused in the same transaction.
    with pytest.raises(Fenced), sessions() as s, s.begin():
        a.fence(s)
    assert a.is_leader is False
    with sessions() as s, s.begin():
        assert b.fence(s) == 2


def test_a_connection_killed_while_idle_is_replaced_before_anyone_uses_it(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pre-ping only after an idle spell: a connection the server dropped (a restart, a
    failover) while it sat in the pool is noticed at checkout and replaced; the caller
    sees no error."""
    from gpufleet.common.db import engine as engine_module

    engine = make_engine(pg_url, pool_size=1, max_overflow=0)
    try:
        with engine.connect() as conn:
            first = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        killer = make_engine(pg_url)
        with killer.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first})
            conn.commit()
        killer.dispose()
        monkeypatch.setattr(engine_module, "PING_IDLE_S", 0.0)  # it has been idle long enough
        with engine.connect() as conn:
            second = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        assert second != first
    finally:
        engine.dispose()


def test_a_leader_keeps_its_lease_through_a_pass_longer_than_the_lease(db_url: str) -> None:
    """A live leader whose pass outlasts the lease (a net waiting out bounded provider
    calls) is not replaced mid-pass: the ticker renews while the task runs. A standby
    that tries during the pass is refused; one that tries after a real pause wins."""
    clock = ManualClock()
    sessions = make_sessionmaker(make_engine(db_url))
    a = LeaderLease("reaper", "a", clock, sessions, ttl_s=15)
    b = LeaderLease("reaper", "b", clock, sessions, ttl_s=15)
    standby: list[bool] = []

    def renewed_since(before: datetime) -> bool:
        with sessions() as s:
            expires = s.execute(text("SELECT expires_at FROM leader_leases WHERE name = 'reaper'")).scalar()
        if isinstance(expires, str):  # SQLite keeps the text
            expires = datetime.fromisoformat(expires)
        return expires.replace(tzinfo=UTC) > before + timedelta(seconds=10)

    def long_pass(now: datetime) -> TickReport:
        for _ in range(8):  # 40 s of clock time, the lease is 15 s
            clock.advance(timedelta(seconds=5))
            moved = clock.now()
            deadline = time.monotonic() + 10
            while not renewed_since(moved) and time.monotonic() < deadline:
                time.sleep(0.01)
            standby.append(b.try_acquire())
        with sessions() as s, s.begin():
            a.fence(s)  # still the leader: its writes go through
        return TickReport()

    ticker = Ticker("reaper", clock, sessions, a, [PeriodicTask("long_pass", 60, long_pass)], renew_s=5)
    assert a.try_acquire()
    ticker.run_due()
    assert standby == [False] * 8 and a.is_leader
    # Without a running task nobody renews: a paused leader still loses its lease.
    clock.advance(timedelta(seconds=16))
    assert b.try_acquire() is True
    with pytest.raises(Fenced), sessions() as s, s.begin():
        a.fence(s)


def test_the_statement_pool_survives_a_dropped_connection_and_says_unavailable_when_down(
    pg_url: str,
) -> None:
    """SubmitJob's lean path: a connection the server dropped is replaced and the statement
    runs once more; a database that is not there is UNAVAILABLE, not an internal error."""
    engine = make_engine(pg_url)

    async def dropped_and_replaced() -> None:
        pool = StatementPool(engine, max_size=2)
        try:
            sql = pool.compile(text("SELECT pg_backend_pid(), :n + 1"))
            first_pid, two = await pool.fetch_one(sql, {"n": 1}) or (None, None)
            assert two == 2
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": first_pid})
            second_pid, three = await pool.fetch_one(sql, {"n": 2}) or (None, None)
            assert (three, second_pid != first_pid) == (3, True)
        finally:
            await pool.aclose()

    async def nowhere_is_unavailable() -> None:
        nowhere = make_engine(f"postgresql://postgres@127.0.0.1:{free_port()}/none")
        pool = StatementPool(nowhere, timeout_s=1)
        try:
            with pytest.raises(Unavailable):
                await pool.fetch_one(pool.compile(text("SELECT 1")), {})
        finally:
            await pool.aclose()

    try:
        asyncio.run(dropped_and_replaced())
    finally:
        engine.dispose()
    asyncio.run(nowhere_is_unavailable())


def backend_gone(engine: Engine, pid: int, within_s: float = 10.0) -> bool:
    """The server ends a backend shortly after its client closes the connection."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if not conn.execute(text("SELECT 1 FROM pg_stat_activity WHERE pid = :p"), {"p": pid}).first():
                return True
        time.sleep(0.05)
    return False


def test_the_statement_pool_closes_from_another_thread_on_its_own_loop(pg_url: str) -> None:
    """A server's loop runs on a thread of its own; the service closes its pool from the
    main thread, while that loop still runs or once it has stopped."""
    engine = make_engine(pg_url)
    try:
        for stop_first in (False, True):
            pool = StatementPool(engine, max_size=1)
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, daemon=True)
            thread.start()
            sql = pool.compile(text("SELECT pg_backend_pid()"))
            (pid,) = asyncio.run_coroutine_threadsafe(pool.fetch_one(sql, {}), loop).result(30) or (0,)
            if stop_first:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(10)
            pool.close()
            assert backend_gone(engine, pid)
            if not stop_first:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(10)
            loop.close()
    finally:
        engine.dispose()
