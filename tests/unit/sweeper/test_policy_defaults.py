"""The orphan sweep's policy defaults to what the sweeper's Settings default to (production
builds it from Settings; tests build it from the dataclass)."""

from __future__ import annotations

from gpufleet.sweeper.orphan_sweep import OrphanPolicy
from gpufleet.sweeper.settings import Settings


def test_the_orphan_policys_defaults_are_the_settings_defaults() -> None:
    s = Settings.model_construct()
    assert s.orphan_policy() == OrphanPolicy(deployment_id=s.deployment_id)
