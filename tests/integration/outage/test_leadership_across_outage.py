"""The leader's side of a PostgreSQL restart, on a server of the test's own that it stops
and starts (``immediate``: every connection dropped at once, as in a crash or a failover).

- A write in flight when the server goes is all or nothing: its transaction holds the
  fence (the lease row's lock) and the write together, and neither outlives the restart.
- A pass that read its snapshot before the outage writes nothing after it: the lease was
  interrupted, and re-acquiring it starts a new term (a new epoch) that the old pass's
  fence refuses — even though no other replica ever held the lease.
- The Ticker lives through the outage, backs off instead of spinning or dying, and after
  the database returns runs no pass until ``settle_s`` of the clock has passed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import OperationalError

from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import LeaderLease as LeaseRow
from gpufleet.common.db.outage import DatabaseWatch, is_outage
from gpufleet.common.errors import Fenced
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import PeriodicTask, Ticker, TickReport
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.postgres


def wait_for(check: Callable[[], object], what: str, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.02)


def test_a_pass_that_read_before_an_outage_writes_nothing_after_it(own_postgres: PostgresServer) -> None:
    engine = make_engine(own_postgres.url("gpufleet"))
    sessions = make_sessionmaker(engine)
    clock = ManualClock()
    lease = LeaderLease("reaper", "reaper-a", clock, sessions, ttl_s=15)
    with sessions() as s, s.begin():
        s.execute(text("CREATE TABLE decisions (what text)"))
    assert lease.try_acquire() and lease.epoch == 1

    def written() -> list[str]:
        with sessions() as s:
            return list(s.execute(text("SELECT what FROM decisions ORDER BY what")).scalars())

    with lease.term():
        # A write whose commit the restart cuts off: the fence and the row go together.
        session = sessions()
        session.begin()
        lease.fence(session)
        session.execute(text("INSERT INTO decisions VALUES ('cut off')"))
        own_postgres.shut_down("immediate")
        with pytest.raises(OperationalError) as cut:
            session.commit()
        session.close()
        assert is_outage(cut.value)
        # The renewal meanwhile fails: the lease is interrupted, whatever its row says.
        with pytest.raises(OperationalError):
            lease.try_acquire()
        own_postgres.start_again()

        # Back, the row still names this replica with epoch 1 — and the pass, which read
        # before the outage, is refused before and after the lease is re-acquired.
        with pytest.raises(Fenced, match="before the database was lost"), sessions() as s, s.begin():
            lease.fence(s)
            s.execute(text("INSERT INTO decisions VALUES ('stale, before re-acquiring')"))
        assert lease.try_acquire() and lease.epoch == 2
        with pytest.raises(Fenced), sessions() as s, s.begin():
            lease.fence(s)
            s.execute(text("INSERT INTO decisions VALUES ('stale, after re-acquiring')"))

    # A pass of the new term reads afresh and writes.
    with lease.term(), sessions() as s, s.begin():
        lease.fence(s)
        s.execute(text("INSERT INTO decisions VALUES ('fresh')"))
    assert written() == ["fresh"]
    with sessions() as s:
        row = s.execute(select(LeaseRow).where(LeaseRow.name == "reaper")).scalar_one()
        assert (row.holder, row.epoch) == ("reaper-a", 2)
    engine.dispose()


def test_the_ticker_backs_off_through_an_outage_and_settles_before_its_next_pass(
    own_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine(own_postgres.url("gpufleet"))
    sessions = make_sessionmaker(engine)
    clock = ManualClock()
    lease = LeaderLease("sweeper", "sweeper-a", clock, sessions, ttl_s=15)
    watch = DatabaseWatch(engine, clock, probe_every_s=0.1, max_backoff_s=0.5)
    passes: list[datetime] = []

    def one_pass(now: datetime) -> TickReport:
        with sessions() as s, s.begin():
            lease.fence(s)
        passes.append(now)
        return TickReport()

    ticker = Ticker(
        "sweeper",
        clock,
        sessions,
        lease,
        [PeriodicTask("one_pass", 1.0, one_pass)],
        renew_s=1.0,
        watch=watch,
        settle_s=30.0,
        max_backoff_s=0.5,
    )
    health: list[bool] = []
    watch.on_change(health.append)
    watch.start()
    stop = threading.Event()
    thread = threading.Thread(target=ticker.run_forever, args=(stop,), daemon=True)
    caplog.set_level(logging.WARNING)
    thread.start()
    try:
        wait_for(lambda: passes, "a first pass")

        own_postgres.shut_down("immediate")
        wait_for(lambda: health == [False], "the watch sees the database gone")
        # The clock runs on while the database is away; the loop keeps trying.
        for _ in range(5):
            clock.advance(2.0)
            time.sleep(0.2)
        assert thread.is_alive()
        ran_before = len(passes)

        own_postgres.start_again()
        wait_for(lambda: health == [False, True], "the watch sees it back")
        wait_for(lambda: lease.epoch == 2, "a new term")
        # Back, but not settled: the machines have not reported yet.
        clock.advance(2.0)
        time.sleep(0.5)
        assert len(passes) == ran_before
        clock.advance(30.0)
        wait_for(lambda: len(passes) > ran_before, "a pass once settled")
        assert thread.is_alive()
    finally:
        stop.set()
        thread.join(10)
        watch.close()
        engine.dispose()
    # A known condition: warnings, never a stack trace.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any("the database is unavailable" in r.getMessage() for r in caplog.records)
    assert timedelta(0) < passes[-1] - passes[0]
