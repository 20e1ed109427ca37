"""How long the ledger's quarantining outcomes last: one policy for every detector.

Its own module, free of the database, so that every service's settings can build it
(the agent and the provisioner may not import SQLAlchemy)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class OutcomePolicy:
    """How long the quarantining outcomes last (``None``: until a human clears them)."""

    offering_quarantine_ttl: timedelta | None = timedelta(minutes=30)
    halt_ttl: timedelta | None = None
    # Back-off before a job whose machine was replaced is dispatched again (doubles per loss).
    lost_retry_backoff_s: float = 30.0
    # Ends a job cannot have caused that it may ride out (gpufleet.common.job_lifecycle).
    disruption_budget: int = 20
