"""The catalogue's kind defaults: the pool and pipeline version SubmitJob fills in."""

from __future__ import annotations

from typing import Any

import pytest

from gpufleet.common.catalog import DEFAULT_CATALOG, SAMPLE_PIPELINE_VERSION, Catalog


def catalogue(*kinds: dict[str, Any]) -> dict[str, Any]:
    offering = {
        "provider": "LOCAL",
        "region": "r",
        "zone": "z",
        "instance_type": "t",
        "hourly_price_micros": 1,
    }
    return {
        "plans": [{"id": "p"}],
        "workspaces": [],
        "kinds": list(kinds),
        "pools": [
            {"id": "small", "slots_per_machine": 1, "offerings": [{**offering, "id": "o1", "slots": 1}]},
            {"id": "big", "slots_per_machine": 4, "offerings": [{**offering, "id": "o2", "slots": 4}]},
        ],
    }


def test_the_embedded_catalogue_gives_every_kind_a_pool_and_a_pipeline_version() -> None:
    assert {(k.default_pool, k.default_pipeline_version) for k in DEFAULT_CATALOG.kinds} == {
        ("l4", SAMPLE_PIPELINE_VERSION)
    }


def test_a_kind_without_a_pool_gets_the_first_that_fits() -> None:
    got = Catalog.model_validate(
        catalogue(
            {"id": "one", "slots": 1, "time_limit_s": 1},
            {"id": "two", "slots": 2, "time_limit_s": 1},
            {"id": "film", "slots": 0, "time_limit_s": 1},
            {"id": "huge", "slots": 8, "time_limit_s": 1},
            {"id": "named", "slots": 1, "time_limit_s": 1, "default_pool": "big"},
        )
    )
    assert {k.id: k.default_pool for k in got.kinds} == {
        "one": "small",
        "two": "big",
        "film": "small",
        "huge": None,  # no pool fits: a job of it must name one (and be refused there)
        "named": "big",
    }
    assert all(k.default_pipeline_version is None for k in got.kinds)


@pytest.mark.parametrize(
    ("kind", "complaint"),
    [
        ({"default_pool": "h100"}, "unknown default_pool 'h100'"),
        ({"slots": 2, "default_pool": "small"}, "needs 2 slots"),
        ({"default_pipeline_version": "1; rm -rf /"}, "default_pipeline_version"),
    ],
)
def test_a_bad_default_is_refused_at_load(kind: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match="default_p") as info:
        Catalog.model_validate(catalogue({"id": "k", "time_limit_s": 1, **kind}))
    assert complaint in str(info.value)
