"""The columns a create's and a start's intent record (scale.create_values, start_values),
decided once for the scale step's writer and the simulator: the intent and the call
pending before any provider is called, the provision deadline fixed at the request, the
film a machine is for, both idle timers cleared, and a start's new life observed by
nothing yet."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet.scheduler.tick.scale import CREATE, START, create_values, start_values

NOW = datetime(2026, 12, 5, 15, 0, tzinfo=UTC)


def test_a_create_records_its_intent_its_deadline_and_its_film() -> None:
    assert create_values("film-1", NOW, 1200.0) == {
        "intent": "RUNNING",
        "lost": False,
        "cordoned": False,
        "requested_at": NOW,
        "provision_deadline_at": NOW + timedelta(seconds=1200),
        "state_changed_at": NOW,
        "preemption_count": 0,
        "spot_seconds": 0.0,
        "start_failures": 0,
        "pending_call": CREATE,
        "pending_call_at": NOW,
        "dispatch_failures": 0,
        "earmarked_for": "film-1",
        "earmarked_at": NOW,
    }
    shorts = create_values(None, NOW, 1200.0)
    assert (shorts["earmarked_for"], shorts["earmarked_at"]) == (None, None)


def test_a_start_clears_the_idle_timers_and_forgets_the_last_lifes_sighting() -> None:
    assert start_values(None, NOW) == {
        "intent": "RUNNING",
        "earmarked_for": None,
        "earmarked_at": None,
        "pending_call": START,
        "pending_call_at": NOW,
        "stop_due_at": None,
        "destroy_due_at": None,
        "first_observed_at": None,
    }
    assert start_values("film-2", NOW)["earmarked_at"] == NOW
