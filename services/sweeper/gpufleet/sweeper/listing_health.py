"""Whether the orphan sweep could read each provider's list, round after round.

A provider that cannot be listed means no orphan of it can be found or removed: the
sweep takes no action on it that round, and after ``rounds_before_incident`` rounds in a
row a human hears of it (one ledger row and one incident per failing streak). The same
holds for the provisioner itself (``PROVISIONER``): when it cannot be reached, nothing
can be listed at all.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.common.db.models import ProviderListing
from gpufleet.common.ledger import FailureClass, record_failure

PROVISIONER = "PROVISIONER"


def record_round(
    session: Session,
    now: datetime,
    failed: Iterable[str],
    *,
    why: str,
    rounds_before_incident: int,
    detector: str,
) -> list[str]:
    """One round's listing outcome, inside the caller's (fenced) transaction: ``failed``
    could not be listed; every other provider on record (and the provisioner) could —
    unless ``failed`` names the provisioner, when nothing was listed at all. Returns the
    providers whose streak reached the threshold this round (an incident opened for each)."""
    failing = set(failed)
    rows = {r.provider: r for r in session.execute(select(ProviderListing).with_for_update()).scalars()}
    alerted: list[str] = []
    for provider in sorted(failing):
        row = rows.get(provider)
        if row is None:
            row = ProviderListing(provider=provider, failed_rounds=0, last_error="")
            session.add(row)
        if row.failed_rounds == 0 or row.failing_since is None:
            row.failing_since = now
        row.failed_rounds += 1
        row.last_error = why[:2000]
        if row.failed_rounds == rounds_before_incident:
            what = (
                "the provisioner could not be reached"
                if provider == PROVISIONER
                else f"{provider} could not be listed"
            )
            record_failure(
                session,
                now,
                FailureClass.PROVIDER_CALL_FAILED,
                detector,
                details=(
                    f"{what} for {row.failed_rounds} orphan sweeps in a row (since "
                    f"{row.failing_since.isoformat()}): no orphan there can be found or removed "
                    f"until it can; last error: {why}"
                ),
                incident_key=f"{detector}:unlisted:{provider}:{row.failing_since.isoformat()}",
            )
            alerted.append(provider)
    for provider, row in rows.items():
        # With the provisioner down nothing was listed: no provider's streak ends.
        if provider in failing or PROVISIONER in failing:
            continue
        row.failed_rounds = 0
        row.failing_since = None
        row.last_listed_at = now
    return alerted
