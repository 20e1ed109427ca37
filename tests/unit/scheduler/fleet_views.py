"""Snapshot views for the scheduler's metric tests: a GCP L4 machine, a running attempt and
a snapshot of two pools, each overridden by keyword."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from gpufleet.scheduler.tick.model import AttemptView, FleetSnapshot, MachineView, OfferingView, PoolView

NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def machine(mid: str, state: str = "READY", pool: str | None = "l4", **kw: object) -> MachineView:
    base = MachineView(
        id=mid,
        pool_id=pool,
        state=state,
        intent="RUNNING",
        origin="PROVISIONED",
        managed=True,
        lost=False,
        cordoned=False,
        slots=4,
        busy_slots=frozenset(),
        worker_report_at=NOW,
        hourly_price_micros=1_250_000,
        capacity_type="ON_DEMAND",
        preemption_count=0,
        spot_seconds=0.0,
        backoff_until=None,
        agent_address=None,
        provider="GCP",
        gpu_count=1,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def running_on(machine_id: str, n: int = 1) -> AttemptView:
    return AttemptView(
        id=f"a-{machine_id}-{n}",
        job_id=f"j-{machine_id}-{n}",
        machine_id=machine_id,
        state="RUNNING",
        started_at=NOW - timedelta(minutes=5),
        lease_expires_at=NOW + timedelta(minutes=1),
        slots=1,
        time_limit_s=3600.0,
    )


def snapshot(
    machines: list[MachineView],
    attempts: list[AttemptView] = (),  # type: ignore[assignment]
    now: datetime = NOW,
    **kw: object,
) -> FleetSnapshot:
    base = FleetSnapshot(
        now=now,
        queued=[],
        running_per_workspace={},
        workspace_limits={},
        machines=machines,
        pools={"l4": PoolView("l4", 4, 8), "a100": PoolView("a100", 1, 2)},
        offerings=[OfferingView("gcp-l4", "l4", 0, "GCP", "r", "z", 4, "ON_DEMAND", 1_250_000)],
        live_attempts=list(attempts),
    )
    return replace(base, **kw)  # type: ignore[arg-type]
