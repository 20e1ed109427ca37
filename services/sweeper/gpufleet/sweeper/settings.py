"""The sweeper's typed settings (env prefix ``GPUFLEET_``, e.g. ``GPUFLEET_INVENTORY_RECONCILE_EVERY_S``)."""

from __future__ import annotations

from pydantic import Field

from gpufleet.common.settings import StoreSettings


class Settings(StoreSettings):
    listen_address: str = "127.0.0.1:50054"
    # Seconds of clock time between inventory reconciles (DESIGN §4: 60 s).
    inventory_reconcile_every_s: float = Field(default=60.0, gt=0)
    # Listing every instance at every provider may page through many results.
    provider_timeout_s: float = Field(default=60.0, gt=0)
