"""Two metrics every timer service gets from libs/common, on a real PostgreSQL:
``gpufleet.leader.leading`` across two holders of one lease, and ``gpufleet.ledger.failures``
counted for the rows that committed — and only those."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.clock import ManualClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import Failure
from gpufleet.common.errors import Fenced
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import record_and_apply, record_failure
from gpufleet.common.metrics.catalog import LEADER_LEADING, LEDGER_FAILURES
from tests.support.metrics import MetricsProbe

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


@pytest.fixture
def sessions(pg_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(pg_url)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture
def probe() -> Iterator[MetricsProbe]:
    p = MetricsProbe()
    yield p
    p.close()


# -- gpufleet.leader.leading ---------------------------------------------------------------------


def test_leading_is_one_for_the_holder_and_zero_for_the_standby_across_a_handover(
    sessions: sessionmaker[Session],
) -> None:
    clock = ManualClock(T0)
    probe_a, probe_b = MetricsProbe(), MetricsProbe()
    a = LeaderLease("sweeper", "a", clock, sessions, ttl_s=15, instruments=probe_a.instruments)
    b = LeaderLease("sweeper", "b", clock, sessions, ttl_s=15, instruments=probe_b.instruments)

    def leading() -> tuple[float, float]:
        return probe_a.value(LEADER_LEADING.name, lease="sweeper"), probe_b.value(
            LEADER_LEADING.name, lease="sweeper"
        )

    assert leading() == (0, 0)  # neither has tried yet: both stand by
    assert a.try_acquire() and not b.try_acquire()
    assert leading() == (1, 0)

    # a is paused past its term: it stops counting itself at once, before it learns anything.
    clock.advance(16)
    assert leading() == (0, 0)
    assert b.try_acquire()
    assert leading() == (0, 1)
    with pytest.raises(Fenced), sessions() as s, s.begin():
        a.fence(s)  # a wakes and writes: refused
    assert leading() == (0, 1)

    b.release()  # a graceful stop
    assert leading() == (0, 0)
    assert a.try_acquire()
    assert leading() == (1, 0)
    a.close()
    assert probe_a.series(LEADER_LEADING.name) == {}
    for p in (probe_a, probe_b):
        p.close()


def test_a_lease_nobody_keeps_leaves_the_gauge(sessions: sessionmaker[Session], probe: MetricsProbe) -> None:
    lease = LeaderLease("reaper", "a", ManualClock(T0), sessions, ttl_s=15, instruments=probe.instruments)
    assert probe.series(LEADER_LEADING.name) == {(("lease", "reaper"),): 0}
    del lease
    assert probe.series(LEADER_LEADING.name) == {}


# -- gpufleet.ledger.failures ----------------------------------------------------------------------


def failures(probe: MetricsProbe) -> dict[tuple[str, str], float]:
    return {
        (dict(k)["failure_class"], dict(k)["outcome"]): v
        for k, v in probe.series(LEDGER_FAILURES.name).items()
    }


def rows(sessions: sessionmaker[Session]) -> int:
    with sessions() as s:
        return int(s.execute(select(func.count()).select_from(Failure)).scalar_one())


def test_each_committed_row_is_counted_by_class_and_routed_outcome(
    sessions: sessionmaker[Session], probe: MetricsProbe
) -> None:
    with sessions() as s, s.begin():
        record_failure(s, T0, "went_silent", "went_silent", machine_id="m-1", instruments=probe.instruments)
        record_failure(s, T0, "paid_wait", "paid_wait", job_id="j-1", instruments=probe.instruments)
        record_failure(s, T0, "paid_wait", "paid_wait", job_id="j-2", instruments=probe.instruments)
        assert failures(probe) == {}  # written, not yet committed
    with sessions() as s, s.begin():
        record_and_apply(s, T0, "orphan_found", "orphan_sweep", instruments=probe.instruments)
        # A class the routing table does not know alerts a human, and says so.
        record_failure(s, T0, "something_new", "x", instruments=probe.instruments)
    assert failures(probe) == {
        ("went_silent", "REPLACE_MACHINE"): 1,
        ("paid_wait", "ALERT_HUMAN"): 2,
        ("orphan_found", "NOTHING"): 1,
        ("something_new", "ALERT_HUMAN"): 1,
    }
    assert rows(sessions) == 5


def test_a_row_whose_transaction_rolls_back_is_not_counted(
    sessions: sessionmaker[Session], probe: MetricsProbe
) -> None:
    class Boom(Exception):
        pass

    with pytest.raises(Boom), sessions() as s, s.begin():
        record_failure(s, T0, "went_silent", "went_silent", machine_id="m-1", instruments=probe.instruments)
        raise Boom  # e.g. the pass was fenced after the row was written

    # Written and flushed, then the session closed without a commit.
    with sessions() as s:
        record_failure(s, T0, "went_silent", "went_silent", machine_id="m-2", instruments=probe.instruments)

    # A savepoint around one row rolls back; the row beside it commits.
    with sessions() as s, s.begin():
        record_failure(s, T0, "paid_wait", "paid_wait", job_id="j-1", instruments=probe.instruments)
        nested = s.begin_nested()
        record_failure(s, T0, "went_silent", "went_silent", machine_id="m-3", instruments=probe.instruments)
        nested.rollback()
        with s.begin_nested():  # released: it commits with the transaction around it
            record_failure(s, T0, "stockout", "provisioner", instruments=probe.instruments)

    # The same session used again: nothing of its rolled-back past is counted now.
    s = sessions()
    with s.begin():
        record_failure(s, T0, "went_silent", "went_silent", machine_id="m-4", instruments=probe.instruments)
        s.rollback()
    with s.begin():
        record_failure(s, T0, "orphan_found", "orphan_sweep", instruments=probe.instruments)
    s.close()

    assert failures(probe) == {
        ("paid_wait", "ALERT_HUMAN"): 1,
        ("stockout", "STOP_HARDWARE_CONFIG"): 1,
        ("orphan_found", "NOTHING"): 1,
    }
    assert rows(sessions) == 3  # the figures are the table's
