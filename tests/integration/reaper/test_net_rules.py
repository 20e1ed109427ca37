"""The nets' own rules in a running control plane: went silent's floor, boot failure's
live re-confirmation, and a provider error during stop or destroy left for the
stuck-transition watchdog, which finishes it once the provider agrees, re-issues a stop or
destroy the provider never carried out (recorded first, a bounded number of times), and
alerts a human once those are spent."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from gpufleet.common.provider_errors import Transient
from gpufleet.provisioner.drivers.base import InstanceStatus
from tests.integration.reaper.plane import running_plane


def test_went_silent_configured_at_one_minute_behaves_as_five(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="gpufleet.reaper.settings"):
        plane_cm = running_plane(pg_url, went_silent_after_s=60)
        plane = plane_cm.__enter__()
    try:
        assert any("floor" in r.getMessage() for r in caplog.records)
        mid = plane.machine()
        plane.agents[mid].busy(gpu=80.0)
        plane.reporting.add(mid)
        plane.tick()
        plane.reporting.discard(mid)
        stopped = plane.clock.now()
        for _ in range(9):  # 4.5 minutes of silence: a 1-minute threshold would have fired
            plane.step(30)
        assert plane.row(mid).state == "READY"
        caught = plane.run_until(lambda: plane.row(mid).state == "DESTROYED", within_s=120)
        assert caught is not None and stopped + timedelta(minutes=5) <= caught <= stopped + timedelta(
            minutes=6
        )
        assert plane.ledger(mid) == [("went_silent", "went_silent", "REPLACE_MACHINE")]
    finally:
        plane_cm.__exit__(None, None, None)


def test_a_start_up_that_fails_once_then_passes_is_not_destroyed(pg_url: str) -> None:
    with running_plane(pg_url) as plane:
        t0 = plane.clock.now()
        mid = plane.machine(
            state="BOOTING",
            requested_at=t0,
            provision_deadline_at=t0 + timedelta(minutes=20),
            first_observed_at=t0,
            state_changed_at=t0,
        )
        agent = plane.agents[mid]
        agent.quiet()
        agent.startup_complete = False  # a slow image pull
        plane.tick()
        seen = plane.run_until(lambda: plane.row(mid).startup_failed_at is not None, within_s=31 * 60)
        assert seen is not None and seen >= t0 + timedelta(minutes=30)
        assert plane.acted(mid) == {"boot_failure": {"startup_failure_seen"}}

        agent.startup_complete = True  # it finishes before the re-confirming tick
        plane.step(30)
        plane.step(30)
        row = plane.row(mid)
        assert (row.state, row.startup_failed_at) == ("BOOTING", None)
        assert plane.acted(mid) == {"boot_failure": {"startup_failure_seen", "startup_failure_cleared"}}
        assert "STARTUP_HEALTHY" in plane.refused(mid)["boot_failure"]

        plane.reporting.add(mid)  # and its worker registers: READY, and serves
        agent.busy(requests=2)
        for _ in range(60):
            plane.step(30)
        assert plane.row(mid).state == "READY"
        assert plane.provider_ops(mid) == [] and plane.ledger(mid) == []


def test_a_failed_stop_is_reissued_once_stuck_and_then_done(pg_url: str) -> None:
    with running_plane(pg_url) as plane:
        now = plane.clock.now()
        mid = plane.machine(stop_due_at=now - timedelta(seconds=1), destroy_due_at=now + timedelta(hours=2))
        plane.agents[mid].quiet()
        plane.reporting.add(mid)
        plane.sim.cloud.fail_next("stop", Transient("throttled"))
        plane.tick()
        assert (plane.row(mid).state, plane.row(mid).intent) == ("STOPPING", "STOPPED")
        assert plane.ledger(mid) == [("provider_call_failed", "auto_stop", "ALERT_HUMAN")]
        for _ in range(9):  # inside the ten minutes: only reads, if anything
            plane.step(60)
        assert plane.row(mid).state == "STOPPING"
        assert [c for c in plane.provider_ops(mid) if c != "get"] == ["stop"]

        # Ten minutes in STOPPING: a fresh read finds the instance still running, so the
        # stop is sent again — recorded in the ledger first — and this time it goes through.
        done = plane.run_until(lambda: plane.row(mid).state == "STOPPED", within_s=2 * 60)
        assert done is not None and done <= now + timedelta(minutes=11)
        row = plane.row(mid)
        assert (row.intent, row.stop_due_at) == ("STOPPED", None)
        assert plane.instance_status(mid) is InstanceStatus.STOPPED
        assert plane.ledger(mid) == [
            ("provider_call_failed", "auto_stop", "ALERT_HUMAN"),
            ("transition_reissued", "stuck_transition", "NOTHING"),
        ]
        assert [c for c in plane.provider_ops(mid) if c != "get"] == ["stop", "stop"]
        assert plane.acted(mid)["stuck_transition"] == {"stop_reissued"}
        assert sorted(plane.incidents(mid)) == ["provider_call_failed"]


def test_a_stop_that_keeps_failing_is_reissued_twice_then_left_for_a_human(pg_url: str) -> None:
    with running_plane(pg_url) as plane:
        now = plane.clock.now()
        mid = plane.machine(stop_due_at=now - timedelta(seconds=1), destroy_due_at=now + timedelta(hours=2))
        plane.agents[mid].quiet()
        plane.reporting.add(mid)
        plane.sim.cloud.fail_next("stop", Transient("throttled"), times=3)
        plane.tick()
        alerted = plane.run_until(
            lambda: any(c == "transition_stuck" for c, _, _ in plane.ledger(mid)), within_s=25 * 60
        )
        # Re-issued at about 10 and 15 minutes; the alert once the second is 5 minutes old.
        assert alerted is not None and now + timedelta(minutes=20) <= alerted <= now + timedelta(minutes=22)
        assert plane.ledger(mid) == [
            ("provider_call_failed", "auto_stop", "ALERT_HUMAN"),
            ("transition_reissued", "stuck_transition", "NOTHING"),
            ("provider_call_failed", "stuck_transition", "ALERT_HUMAN"),
            ("transition_reissued", "stuck_transition", "NOTHING"),
            ("provider_call_failed", "stuck_transition", "ALERT_HUMAN"),
            ("transition_stuck", "stuck_transition", "ALERT_HUMAN"),
        ]
        # The same call each time (one idempotency key), so one incident for it.
        assert sorted(plane.incidents(mid)) == ["provider_call_failed", "transition_stuck"]
        for _ in range(10):
            plane.step(60)
        assert plane.row(mid).state == "STOPPING"
        assert [c for c in plane.provider_ops(mid) if c != "get"] == ["stop"] * 3
        assert len(plane.ledger(mid)) == 6  # nothing more: one alert, no third re-issue

        plane.provider_stops(mid)  # a human stops it at the provider
        plane.step(60)
        row = plane.row(mid)
        assert (row.state, row.intent, row.stop_due_at) == ("STOPPED", "STOPPED", None)
        assert plane.acted(mid)["stuck_transition"] == {
            "stop_reissue_failed",
            "alert",
            "still_stuck",
            "finish",
        }


def test_a_failed_destroy_the_provider_carried_out_anyway_is_finished(pg_url: str) -> None:
    with running_plane(pg_url) as plane:
        now = plane.clock.now()
        mid = plane.machine(
            agent=False, state="STOPPED", intent="STOPPED", destroy_due_at=now - timedelta(seconds=1)
        )
        plane.sim.cloud.fail_next("destroy", Transient("answer lost"))
        plane.tick()
        assert plane.row(mid).state == "DESTROYING"
        plane.provider_deletes(mid)  # it went through after all
        finished = plane.run_until(lambda: plane.row(mid).state == "DESTROYED", within_s=11 * 60)
        assert finished is not None and finished <= now + timedelta(minutes=11)
        assert plane.ledger(mid) == [("provider_call_failed", "auto_destroy", "ALERT_HUMAN")]
        assert plane.provider_ops(mid) == ["destroy", "get"]
        assert plane.acted(mid)["stuck_transition"] == {"finish"}


def test_a_failed_destroy_the_provider_never_carried_out_is_reissued_and_the_instance_ends(
    pg_url: str,
) -> None:
    with running_plane(pg_url) as plane:
        now = plane.clock.now()
        mid = plane.machine(
            agent=False, state="STOPPED", intent="STOPPED", destroy_due_at=now - timedelta(seconds=1)
        )
        plane.sim.cloud.fail_next("destroy", Transient("throttled"))
        plane.tick()
        assert plane.row(mid).state == "DESTROYING"
        done = plane.run_until(lambda: plane.row(mid).state == "DESTROYED", within_s=12 * 60)
        assert done is not None and done <= now + timedelta(minutes=11)
        assert plane.instance_status(mid) is None
        assert [c for c in plane.provider_ops(mid) if c != "get"] == ["destroy", "destroy"]
        assert plane.ledger(mid) == [
            ("provider_call_failed", "auto_destroy", "ALERT_HUMAN"),
            ("transition_reissued", "stuck_transition", "NOTHING"),
        ]
