"""A stockout's labels come from the provisioner's catalogue, never from the request's
free text: the offering's own region and id, or ``unlisted``."""

from __future__ import annotations

import pytest

from gpufleet.common.catalog import DEFAULT_CATALOG, Catalog, OfferingSpec, PoolSpec
from gpufleet.provisioner.drivers.base import Offering, Provider
from gpufleet.provisioner.stockouts import UNLISTED, stockout_labels

CATALOG = Catalog(
    plans=DEFAULT_CATALOG.plans,
    workspaces=DEFAULT_CATALOG.workspaces,
    kinds=DEFAULT_CATALOG.kinds,
    pools=[
        PoolSpec(
            id="l4",
            slots_per_machine=2,
            offerings=[
                OfferingSpec(
                    id="sim-l4",
                    provider="SIM",
                    region="sim-1",
                    zone="sim-1a",
                    instance_type="sim.l4",
                    slots=2,
                    hourly_price_micros=300_000,
                ),
                OfferingSpec(
                    id="gcp-l4",
                    provider="GCP",
                    region="us-central1",
                    zone="us-central1-a",
                    instance_type="g2-standard-8",
                    slots=2,
                    hourly_price_micros=700_000,
                ),
            ],
        )
    ],
)


def offering(provider: Provider, offering_id: str, region: str) -> Offering:
    return Offering(
        provider=provider, region=region, zone="z", instance_type="t", slots=1, offering_id=offering_id
    )


CASES = [
    ("the catalogue's offering", offering(Provider.SIM, "sim-l4", "sim-1"), ("sim-1", "sim-l4")),
    # The request's region is the caller's text; the catalogue's is what is counted.
    (
        "the catalogue's region, not the request's",
        offering(Provider.SIM, "sim-l4", "elsewhere"),
        ("sim-1", "sim-l4"),
    ),
    (
        "an unknown id in a region the catalogue names",
        offering(Provider.SIM, "sim-new", "sim-1"),
        ("sim-1", UNLISTED),
    ),
    ("an unknown id and region", offering(Provider.SIM, "x" * 60, "made-up-9"), (UNLISTED, UNLISTED)),
    ("another provider's offering id", offering(Provider.AWS, "gcp-l4", "us-central1"), (UNLISTED, UNLISTED)),
    ("no offering id at all", offering(Provider.GCP, "", "us-central1"), ("us-central1", UNLISTED)),
]


@pytest.mark.parametrize(("case", "refused", "expected"), CASES, ids=[c[0] for c in CASES])
def test_labels(case: str, refused: Offering, expected: tuple[str, str]) -> None:
    region, offering_id = expected
    assert stockout_labels(CATALOG, refused) == {
        "provider": refused.provider.value,
        "region": region,
        "offering": offering_id,
    }
