"""The leader keeps its live attempts' views between ticks and reads only what changed: after
every kind of change an attempt goes through, its snapshot equals one read afresh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import load_catalog
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.tick.model import FleetSnapshot
from gpufleet.scheduler.tick.snapshot import LiveAttempts, load_snapshot
from tests.support.fleet_rows import add_machine, job_row

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def _facts(snapshot: FleetSnapshot) -> dict[str, Any]:
    """What the decision reads of the live attempts, order aside."""
    return {
        "live": sorted(snapshot.live_attempts, key=lambda a: a.id),
        "running": snapshot.running_per_workspace,
        "busy": {m.id: m.busy_slots for m in snapshot.machines},
        "usage": {j.id: j.usage for j in snapshot.queued},
    }


def test_the_kept_view_equals_a_fresh_read_after_every_change(db_url: str) -> None:
    engine = make_engine(db_url)
    sessions: sessionmaker[Session] = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        sync_catalog(s, load_catalog(None))
    machines = [add_machine(sessions, NOW, pool_id="l4", worker_report_at=NOW, slots=2) for _ in range(3)]
    kept = LiveAttempts()
    now = NOW

    def attempt(
        n: int, machine: str, slot: int, state: str = "RUNNING", workspace: str = "acme-studio"
    ) -> str:
        with sessions() as s, s.begin():
            s.add(job_row(now, id=f"job-{n}", workspace_id=workspace, state="RUNNING"))
            s.flush()
            s.add(
                models.Attempt(
                    id=f"att-{n}",
                    job_id=f"job-{n}",
                    machine_id=machine,
                    slot=slot,
                    state=state,
                    started_at=now - timedelta(minutes=n),
                    lease_expires_at=now + timedelta(minutes=1),
                )
            )
        return f"att-{n}"

    def change(**values: Any) -> None:
        with sessions() as s, s.begin():
            attempt_id = values.pop("id")
            s.execute(update(models.Attempt).where(models.Attempt.id == attempt_id).values(**values))

    def same() -> FleetSnapshot:
        with sessions() as s:
            fresh = load_snapshot(s, now, 86400)
        with sessions() as s:
            incremental = load_snapshot(s, now, 86400, kept)
        assert _facts(incremental) == _facts(fresh)
        return incremental

    with sessions() as s, s.begin():
        s.add(job_row(now, id="waiting", workspace_id="acme-studio"))
    assert same().live_attempts == []
    a1 = attempt(1, machines[0], 0, state="STARTING")
    a2 = attempt(2, machines[0], 1, workspace="indie-creator")
    a3 = attempt(3, machines[1], 0)
    assert len(same().live_attempts) == 3

    change(id=a1, state="RUNNING")  # started
    assert {a.id: a.state for a in same().live_attempts}[a1] == "RUNNING"
    now += timedelta(seconds=30)
    change(id=a2, lease_expires_at=now + timedelta(minutes=2))  # a heartbeat renewed it
    assert {a.id: a.lease_expires_at for a in same().live_attempts}[a2] == now + timedelta(minutes=2)
    change(id=a3, state="SUCCEEDED", ended_at=now, slot_seconds=120.0)  # ended
    assert a3 not in {a.id for a in same().live_attempts}
    attempt(4, machines[2], 1)  # a new one
    change(id=a1, state="LOST", ended_at=now, slot_seconds=60.0)
    attempt(5, machines[1], 0, workspace="indie-creator")
    assert sorted(a.id for a in same().live_attempts) == ["att-2", "att-4", "att-5"]

    # The catalogue changes a kind's limit: the kept views carry the new one.
    with sessions() as s, s.begin():
        s.execute(update(models.JobKind).where(models.JobKind.id == "clip").values(time_limit_s=42.0))
    assert {a.time_limit_s for a in same().live_attempts} == {42.0}
    engine.dispose()
