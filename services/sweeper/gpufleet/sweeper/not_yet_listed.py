"""The ledger's record of machines *not yet listed*
(:func:`gpufleet.common.lifecycle.not_yet_listed`): a machine missing from its provider's
list within the grace after its create is kept as it is, and one ``not_yet_listed`` row
(routed NOTHING) says so — on its first missing list only, so a list that lags for several
passes does not fill the ledger."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db.models import Failure
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure


def record_not_yet_listed(
    sessions: sessionmaker[Session],
    lease: LeaderLease,
    now: datetime,
    machine_ids: Sequence[str],
    grace: timedelta,
    *,
    detector: str,
) -> int:
    """One row per machine that has none yet, fenced by the leader's lease; how many."""
    written = 0
    with sessions() as session, session.begin():
        lease.fence(session)
        recorded = set(
            session.execute(
                select(Failure.machine_id).where(
                    Failure.machine_id.in_(list(machine_ids)),
                    Failure.failure_class == FailureClass.NOT_YET_LISTED.value,
                )
            ).scalars()
        )
        for machine_id in machine_ids:
            if machine_id in recorded:
                continue
            record_failure(
                session,
                now,
                FailureClass.NOT_YET_LISTED.value,
                detector,
                machine_id=machine_id,
                details=(
                    f"missing from the provider's list within {grace.total_seconds():.0f}s of its "
                    "create and never listed: kept (not dropped, not re-created) and looked for "
                    "again on the next list"
                ),
            )
            written += 1
    return written
