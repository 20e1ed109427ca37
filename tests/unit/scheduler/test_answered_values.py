"""The columns a create's or a start's answer writes (scale.answered_values), decided once
for the scale step's writer and the simulator: first observed at the answer, the provider's
instance and address, no call pending; a start is a new life besides."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.scheduler.tick.scale import CREATE, START, answered_values

SEEN = datetime(2026, 12, 5, 14, 0, tzinfo=UTC)


def test_a_create_answered_is_first_observed_then_at_its_instance() -> None:
    assert answered_values(CREATE, SEEN, "i-1", "10.0.0.1:7000") == {
        "first_observed_at": SEEN,
        "pending_call": None,
        "pending_call_at": None,
        "agent_address": "10.0.0.1:7000",
        "provider_instance_id": "i-1",
    }


def test_a_start_answered_begins_a_new_life_and_keeps_an_address_not_given() -> None:
    values = answered_values(START, SEEN, "i-1", "")
    assert "agent_address" not in values  # the column keeps the address it had
    assert "provider_instance_id" not in values  # a start keeps its instance
    assert values == {
        "first_observed_at": SEEN,
        "pending_call": None,
        "pending_call_at": None,
        "start_failures": 0,
        "backoff_until": None,
        "lost": False,
        "probe_failed_since": None,
        "startup_failed_at": None,
    }
