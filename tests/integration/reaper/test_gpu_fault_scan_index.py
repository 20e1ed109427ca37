"""Migration 0016: the gpu_fault net's scan reads its own partial index on PostgreSQL (the
planner can prove the scan's predicate implies the index's), matches its model on both
stores, and goes down and up."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from alembic import command
from sqlalchemy import insert, select, text
from sqlalchemy.dialects import postgresql

from gpufleet.common.db.engine import make_engine
from gpufleet.common.db.migrate import alembic_config
from gpufleet.common.db.models import Machine
from gpufleet.reaper.gpu_fault import ACTS_ON, faulted_sql
from gpufleet.reaper.snapshot import not_destroyed, state_in
from tests.integration.reaper.test_schema_0003 import _machine_indexes

INDEX = "ix_machines_gpu_faulted"


def machine_row(now: datetime) -> dict[str, Any]:
    return dict(
        provider="SIM",
        region="sim-1",
        zone="sim-1a",
        instance_type="sim.l4",
        gpu_model="L4",
        gpu_count=1,
        slots=2,
        capacity_type="ON_DEMAND",
        hourly_price_micros=800_000,
        origin="PROVISIONED",
        managed=True,
        workload_class="REPORTING",
        state="READY",
        intent="RUNNING",
        lost=False,
        cordoned=False,
        requested_at=now,
        state_changed_at=now,
        preemption_count=0,
        spot_seconds=0.0,
        start_failures=0,
        dispatch_failures=0,
    )


def test_the_scan_reads_its_partial_index_in_a_fleet_of_healthy_machines(pg_url: str) -> None:
    now = datetime.now(UTC)
    healthy = [dict(machine_row(now), id=f"m-{n:05d}", gpu_health="ok") for n in range(3000)]
    faulted = [
        dict(machine_row(now), id="broken", gpu_health="critical", cordoned=True),
        dict(machine_row(now), id="stopped", state="STOPPED", gpu_health="critical", cordoned=True),
        dict(machine_row(now), id="drained", gpu_health="ok", cordoned=True),
    ]
    query = select(Machine.id).where(not_destroyed(), state_in(ACTS_ON), faulted_sql())
    sql = str(query.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
    engine = make_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.execute(insert(Machine), healthy + faulted)
            conn.execute(text("ANALYZE machines"))
        with engine.connect() as conn:
            plan = "\n".join(str(r[0]) for r in conn.execute(text(f"EXPLAIN {sql}")))
            found = sorted(conn.execute(query).scalars())
    finally:
        engine.dispose()
    assert INDEX in plan, plan
    assert found == ["broken", "drained", "stopped"]


def test_0016_downgrades_and_upgrades(db_url: str) -> None:
    assert "WHERE" in _machine_indexes(db_url)[INDEX].upper()
    cfg = alembic_config(db_url)
    command.downgrade(cfg, "0015")
    assert INDEX not in _machine_indexes(db_url)
    command.upgrade(cfg, "head")
    assert INDEX in _machine_indexes(db_url)
