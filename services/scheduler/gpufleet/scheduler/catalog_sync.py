"""Writes the configured catalogue into the store so the fleet tick can join against it.

Rows are upserted, never deleted: a job or machine may still name a plan, pool or kind
that left the configuration. Workspaces are the exception to the upsert: the catalogue
file only seeds them (a workspace it names is created if missing), because once created
they belong to WorkspaceService — a restart must not undo a plan change or a pause made
through the API.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from gpufleet.common.catalog import Catalog
from gpufleet.common.db import models


def sync_catalog(session: Session, catalog: Catalog) -> None:
    for plan in catalog.plans:
        session.merge(
            models.Plan(
                id=plan.id,
                tier=plan.tier,
                weight=plan.weight,
                max_gpu_jobs=plan.max_gpu_jobs,
                rate_micros=plan.rate_micros,
            )
        )
    session.flush()
    for ws in catalog.workspaces:
        if session.get(models.Workspace, ws.id) is None:
            session.add(models.Workspace(id=ws.id, plan_id=ws.plan, active=ws.active))
    for kind in catalog.kinds:
        session.merge(
            models.JobKind(
                id=kind.id,
                slots=kind.slots,
                time_limit_s=kind.time_limit_s,
                runs_writer_code=kind.runs_writer_code,
                queue_wait_deadline_s=kind.queue_wait_deadline_s,
                retry_budget=kind.retry_budget,
                lost_retry_budget=kind.lost_retry_budget,
                resumes_from_checkpoint=kind.resumes_from_checkpoint,
                expected_duration_s=kind.expected_duration_s,
                memory_limit_mb=kind.memory_limit_mb,
                pids_limit=kind.pids_limit,
                default_pool=kind.default_pool,
                default_pipeline_version=kind.default_pipeline_version,
            )
        )
    for pool in catalog.pools:
        existing = session.get(models.Pool, pool.id)
        session.merge(
            models.Pool(
                id=pool.id,
                gpu_model=pool.gpu_model,
                slots_per_machine=pool.slots_per_machine,
                warm_target=pool.warm_target,
                max_machines=pool.max_machines,
                idle_release_after_s=pool.idle_release_after_s,
                # The idle clock is the pool's state, not configuration: a restart keeps it.
                idle_since=existing.idle_since if existing else None,
                warm_released=existing.warm_released if existing else False,
            )
        )
        session.flush()
        for rank, off in enumerate(pool.offerings):
            session.merge(
                models.Offering(
                    id=off.id,
                    pool_id=pool.id,
                    rank=rank,
                    provider=off.provider,
                    region=off.region,
                    zone=off.zone,
                    instance_type=off.instance_type,
                    gpu_model=off.gpu_model,
                    gpu_count=off.gpu_count,
                    slots=off.slots,
                    capacity_type=off.capacity_type,
                    hourly_price_micros=off.hourly_price_micros,
                )
            )
