"""Which quarantines and halts are in force, in its two forms: ``ledger.in_force_sql`` (every
query that reads them: the fleet tick's snapshot, the reaper's API and gauges, the ledger
keeping one in force rather than opening another) and ``ledger.in_force`` (what the simulator
decides on). Over one table on each store — no expiry, expired a second ago, expiring now and
a second from now, cleared or not — both select the same rows."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import Quarantine
from gpufleet.common.ledger import in_force, in_force_sql

NOW = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)
S = timedelta(seconds=1)


def test_the_query_and_the_decision_agree_on_what_is_in_force(db_url: str) -> None:
    engine = make_engine(db_url)
    try:
        sessions = make_sessionmaker(engine)
        expiries = [None, NOW - S, NOW, NOW + S, NOW + timedelta(days=1)]
        cleared = [None, NOW - timedelta(hours=1)]
        with sessions() as session, session.begin():
            for i, (expires_at, cleared_at) in enumerate(itertools.product(expiries, cleared)):
                session.add(
                    Quarantine(
                        kind="OFFERING",
                        offering_id=f"o-{i}",
                        reason="test",
                        created_at=NOW - timedelta(hours=2),
                        expires_at=expires_at,
                        cleared_at=cleared_at,
                    )
                )
        with sessions() as session:
            selected = set(
                session.execute(select(Quarantine.offering_id).where(*in_force_sql(NOW))).scalars()
            )
            rows = session.execute(select(Quarantine)).scalars().all()
            judged = {q.offering_id for q in rows if q.cleared_at is None and in_force(q.expires_at, NOW)}
        assert selected == judged
        # No expiry, and the two that expire after now; none cleared, none expired at now.
        assert len(selected) == 3
    finally:
        engine.dispose()
