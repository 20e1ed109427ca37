"""The scheduler refuses to start with a lease whose margin past the machines' fence
cannot hold the first lease's hand-off (gpufleet.common.lease_fence)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.scheduler.settings import Settings


def test_the_scheduler_refuses_to_start_with_a_lease_too_short_for_its_dispatch_deadline() -> None:
    with pytest.raises(ValidationError, match="attempt_lease_s=60 leaves machines a margin of 30 s") as err:
        Settings(attempt_lease_s=60.0, dispatch_deadline_s=30.0)
    assert "dispatch_deadline_s=30" in str(err.value) and "Raise attempt_lease_s above 80" in str(err.value)


def test_the_defaults_and_the_demo_keep_the_margin() -> None:
    assert Settings().attempt_lease_s == 90.0
    assert Settings(attempt_lease_s=900.0).attempt_lease_s == 900.0
