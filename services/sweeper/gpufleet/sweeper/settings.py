"""The sweeper's typed settings (env prefix ``GPUFLEET_``, e.g. ``GPUFLEET_ORPHAN_GRACE_S``)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field

from gpufleet.common.settings import StoreSettings
from gpufleet.sweeper.orphan_sweep import OrphanPolicy


class Settings(StoreSettings):
    listen_address: str = "127.0.0.1:50054"
    # Prometheus scrapes its metrics here (README "Metrics"; `gpufleet up` writes the job).
    metrics_address: str = "127.0.0.1:9454"
    # Seconds of clock time between inventory reconciles (DESIGN §4: 60 s).
    inventory_reconcile_every_s: float = Field(default=60.0, gt=0)
    # Seconds of clock time between orphan sweeps (DESIGN §4: 5 min — it lists every
    # instance at every provider, and what it catches is not getting dearer by the second).
    orphan_sweep_every_s: float = Field(default=300.0, gt=0)
    # An orphan is destroyed only once older than this by both the provider's launch time
    # and the first sweep that saw it (DESIGN §4: 30 min).
    orphan_grace_s: float = Field(default=1800.0, ge=0)
    # A machine never listed whose create was requested less than this ago is *not yet
    # listed* when its provider's list lacks it (lists lag creates): kept, neither dropped
    # nor re-created, looked for again; after it, its absence is a loss as always.
    not_listed_grace_s: float = Field(default=600.0, ge=0)
    # Orphan sweeps in a row that could not list a provider before an incident opens.
    unlisted_rounds_before_incident: int = Field(default=3, ge=1)
    # Listing every instance at every provider may page through many results.
    provider_timeout_s: float = Field(default=60.0, gt=0)

    def orphan_policy(self) -> OrphanPolicy:
        return OrphanPolicy(deployment_id=self.deployment_id, grace=timedelta(seconds=self.orphan_grace_s))
