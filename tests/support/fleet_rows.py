"""Factory helpers that write fleet rows (machines, and the attempts that pin them)
straight into a test database, with defaults a test overrides by keyword."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import OfferingSpec
from gpufleet.common.db.models import Attempt, Job, JobKind, Machine, Plan, Pool, Workspace


def add_machine(sessions: sessionmaker[Session], now: datetime, **overrides: Any) -> str:
    """A READY, managed, PROVISIONED sim machine first seen an hour ago (ids are UUIDs)."""
    machine_id = overrides.pop("id", None) or str(uuid.uuid4())
    values: dict[str, Any] = dict(
        id=machine_id,
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
        provider_instance_id=f"sim-{machine_id[:8]}",
        agent_address=None,
        requested_at=now - timedelta(hours=2),
        state_changed_at=now - timedelta(hours=1),
        first_observed_at=now - timedelta(hours=1),
    )
    values.update(overrides)
    with sessions() as s, s.begin():
        s.add(Machine(**values))
    return machine_id


def add_attempt(
    sessions: sessionmaker[Session], now: datetime, machine_id: str, state: str = "RUNNING"
) -> str:
    """An attempt on ``machine_id`` (with the plan/workspace/pool/kind/job it needs)."""
    with sessions() as s, s.begin():
        # Each only if missing: a running scheduler may have synced its catalogue already.
        for row in (
            Plan(id="p"),
            Pool(id="pool", gpu_model="L4", slots_per_machine=2),
            JobKind(id="clip", time_limit_s=3600.0),
        ):
            if s.get(type(row), row.id) is None:
                s.add(row)
        s.flush()
        if s.get(Workspace, "w") is None:
            s.add(Workspace(id="w", plan_id="p"))
            s.flush()
        job = job_row(now, workspace_id="w", pool_id="pool", pipeline_version="1", state="RUNNING")
        job_id = job.id
        s.add(job)
        s.flush()
        attempt_id = str(uuid.uuid4())
        s.add(
            Attempt(
                id=attempt_id,
                job_id=job_id,
                machine_id=machine_id,
                slot=0,
                state=state,
                started_at=now,
                lease_expires_at=now + timedelta(minutes=5),
            )
        )
    return attempt_id


def job_row(now: datetime, **overrides: Any) -> Job:
    """A job (QUEUED, submitted ``now``) of the default catalogue's acme-studio, l4, clip."""
    job_id = overrides.pop("id", None) or str(uuid.uuid4())
    values: dict[str, Any] = dict(
        id=job_id,
        request_id=job_id,
        request_hash="h",
        workspace_id="acme-studio",
        pool_id="l4",
        kind_id="clip",
        pipeline_version="v1",
        tenant_values={},
        state="QUEUED",
        created_at=now,
        updated_at=now,
    )
    values.update(overrides)
    return Job(**values)


def add_job(sessions: sessionmaker[Session], now: datetime, **overrides: Any) -> str:
    with sessions() as s, s.begin():
        row = job_row(now, **overrides)
        s.add(row)
    return row.id


def machine(sessions: sessionmaker[Session], machine_id: str) -> Machine:
    with sessions() as s:
        row = s.get(Machine, machine_id)
        assert row is not None
        return row


def sim_l4_offering(slots: int = 2, hourly_price_micros: int = 800_000) -> OfferingSpec:
    """The tests' one sim offering (``sim-l4`` in sim-1a), as a catalogue lists it."""
    return OfferingSpec(
        id="sim-l4",
        provider="SIM",
        region="sim-1",
        zone="sim-1a",
        instance_type="sim.l4",
        slots=slots,
        hourly_price_micros=hourly_price_micros,
    )
