"""Whether the orphan sweep could read each provider's list, round after round.

A provider that cannot be listed means no orphan of it can be found or removed: the
sweep takes no action on it that round, and after ``rounds_before_incident`` rounds in a
row a human hears of it (one ledger row and one incident per failing streak). The same
holds for the provisioner itself (``PROVISIONER``): when it cannot be reached, nothing
can be listed at all.

Each streak is also a gauge (``gpufleet.sweeper.listing.failures``, by provider, 0 once a
listing succeeds; the provisioner's own streak as ``provider="PROVISIONER"``), which an
alert fires on: :class:`ListingStreaks` holds what the last committed round left, and
reports it only while this replica leads the sweeper (a replica that lost the lease stops
sweeping, and its last figures would otherwise stay, stale, beside the leader's).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpufleet.common.db.models import ProviderListing
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.ledger import FailureClass, record_failure

PROVISIONER = "PROVISIONER"


@dataclass(frozen=True)
class ListingRound:
    """What one round left: the providers whose streak reached the threshold (an incident
    opened for each), and every streak on record (0: the last listing succeeded)."""

    alerted: list[str]
    failed_rounds: dict[str, int]


class ListingStreaks:
    """The streaks of the last committed round, read by the metrics reader's thread."""

    def __init__(self) -> None:
        # Replaced whole after each round (never changed in place), so a collection reads
        # one round's figures.
        self._streaks: dict[str, int] = {}
        self._lease: LeaderLease | None = None

    def committed(
        self, lease: LeaderLease, failed_rounds: Mapping[str, int], listed: Iterable[str] = ()
    ) -> None:
        """A round's outcome, once its transaction has committed. ``listed`` are providers
        listed this round that may have no row yet (never failed): shown as 0."""
        streaks = dict(self._streaks)
        streaks.update(failed_rounds)
        for provider in listed:
            streaks.setdefault(provider, 0)
        self._streaks = streaks
        self._lease = lease

    def observed(self) -> Iterator[tuple[float, Mapping[str, str]]]:
        lease = self._lease
        if lease is None or not lease.is_leader:
            return
        for provider, rounds in sorted(self._streaks.items()):
            yield float(rounds), {"provider": provider}


def record_round(
    session: Session,
    now: datetime,
    failed: Iterable[str],
    *,
    why: str,
    rounds_before_incident: int,
    detector: str,
) -> ListingRound:
    """One round's listing outcome, inside the caller's (fenced) transaction: ``failed``
    could not be listed; every other provider on record (and the provisioner) could —
    unless ``failed`` names the provisioner, when nothing was listed at all."""
    failing = set(failed)
    rows = {r.provider: r for r in session.execute(select(ProviderListing).with_for_update()).scalars()}
    alerted: list[str] = []
    for provider in sorted(failing):
        row = rows.get(provider)
        if row is None:
            row = rows[provider] = ProviderListing(provider=provider, failed_rounds=0, last_error="")
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
    return ListingRound(alerted, {provider: row.failed_rounds for provider, row in rows.items()})
