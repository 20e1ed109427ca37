"""Stockouts by provider, region and offering: which of the catalogue's offerings a cloud
refused to create for want of capacity.

``gpufleet.provider.calls`` already counts ``result=INSUFFICIENT_CAPACITY`` by provider;
this says where, so a dashboard can show one zone's stockout wave beside the offerings that
still create. The labels are taken from this provisioner's catalogue, never from the
request as sent: a caller names an offering's region and id in free text, and a label's
every value is a series kept in the metrics server's memory. A request naming an offering
the catalogue does not hold (the catalogue changed since the caller read it, or a hand-made
call) is counted as ``offering="unlisted"``, with its region only when the catalogue names
that region for the provider.
"""

from __future__ import annotations

from gpufleet.common.catalog import Catalog
from gpufleet.common.metrics.catalog import PROVIDER_STOCKOUTS
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.provisioner.drivers.base import Offering

UNLISTED = "unlisted"


def stockout_labels(catalog: Catalog, offering: Offering) -> dict[str, str]:
    """The bounded labels of one refused create of ``offering``."""
    provider = offering.provider.value
    mine = [o for pool in catalog.pools for o in pool.offerings if o.provider == provider]
    listed = next((o for o in mine if o.id == offering.offering_id), None)
    if listed is not None:
        return {"provider": provider, "region": listed.region, "offering": listed.id}
    region = offering.region if any(o.region == offering.region for o in mine) else UNLISTED
    return {"provider": provider, "region": region, "offering": UNLISTED}


class Stockouts:
    """Counts the creates a cloud refused for want of capacity."""

    def __init__(self, catalog: Catalog, instruments: Instruments = PROCESS) -> None:
        self.catalog = catalog
        self._counter = instruments.counter(PROVIDER_STOCKOUTS)

    def refused(self, offering: Offering) -> None:
        self._counter.add(1, stockout_labels(self.catalog, offering))
