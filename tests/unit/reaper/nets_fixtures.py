"""Shared snapshot builders for the nets' decision tables."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet.reaper.refusal import MachineSnapshot

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def ago(**kw: float) -> datetime:
    return NOW - timedelta(**kw)


# A READY machine of ours, first observed an hour ago, its worker reporting just now.
HEALTHY = MachineSnapshot(
    machine_id="m",
    origin="PROVISIONED",
    managed=True,
    state="READY",
    intent="RUNNING",
    workload_class="REPORTING",
    live_attempts=0,
    requested_at=ago(hours=1, minutes=5),
    provision_deadline_at=ago(minutes=45),
    first_observed_at=ago(hours=1),
    state_changed_at=ago(hours=1),
    provider_seen_at=ago(seconds=30),
    probe_ok_at=ago(seconds=30),
    worker_report_at=ago(seconds=10),
)
