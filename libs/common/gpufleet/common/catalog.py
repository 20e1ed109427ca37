"""The catalogue: plans, workspaces, job kinds, pools and the offerings each pool may use.

It is configuration (a TOML file), read by the scheduler — which syncs it into the store
so the fleet tick can join against it — and by the provisioner for ListOfferings.
Without a file the embedded default applies: one L4 pool served by local machines, the
kinds of the seed (short episode 3 h 30 min, film 9 h on a whole machine, clip), and two
plans.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

ProviderName = Literal["GCP", "AWS", "LOCAL", "SIM"]
# A pipeline version as SubmitJob accepts it (gpufleet.scheduler.validation.VERSION).
PIPELINE_VERSION = r"^[A-Za-z0-9][A-Za-z0-9._+\-]{0,63}$"


class OfferingSpec(BaseModel):
    id: str = Field(min_length=1, max_length=64)
    provider: ProviderName
    region: str
    zone: str
    instance_type: str
    gpu_model: str = "L4"
    gpu_count: int = Field(default=1, ge=1)
    slots: int = Field(ge=1)
    capacity_type: Literal["SPOT", "ON_DEMAND"] = "ON_DEMAND"
    hourly_price_micros: int = Field(ge=0)


class PoolSpec(BaseModel):
    id: str = Field(min_length=1, max_length=64)
    gpu_model: str = "L4"
    slots_per_machine: int = Field(ge=1)
    # Machines kept running while the pool has work, so a job starts without a boot; once
    # the pool has had no work for idle_release_after_s they are released to the money chain.
    warm_target: int = Field(default=0, ge=0)
    idle_release_after_s: float = Field(default=1800.0, gt=0)
    max_machines: int = Field(default=4, ge=0)
    # In order of preference.
    offerings: list[OfferingSpec]


class PlanSpec(BaseModel):
    id: str = Field(min_length=1, max_length=64)
    tier: int = 0
    weight: float = Field(default=1.0, gt=0)
    max_gpu_jobs: int = Field(default=2, ge=0)
    rate_micros: int = Field(default=1_000_000, ge=0)


class WorkspaceSpec(BaseModel):
    id: str = Field(min_length=1, max_length=64)
    plan: str
    active: bool = True


class KindSpec(BaseModel):
    id: str = Field(min_length=1, max_length=64)
    # 0: a whole machine (a film).
    slots: int = Field(default=1, ge=0)
    time_limit_s: float = Field(gt=0)
    runs_writer_code: bool = True
    queue_wait_deadline_s: float = Field(default=86400.0, gt=0)
    retry_budget: int = Field(default=2, ge=0)
    lost_retry_budget: int = Field(default=5, ge=0)
    resumes_from_checkpoint: bool = False
    # How long a job of this kind usually runs; unset: its time limit. The film drain
    # picks the machine whose jobs end soonest by it.
    expected_duration_s: float | None = Field(default=None, gt=0)
    # The job's cgroup on the machine: memory (MiB) and processes it may use.
    memory_limit_mb: int = Field(default=8192, ge=16)
    pids_limit: int = Field(default=1024, ge=8)
    # What SubmitJob fills in when a job of this kind leaves them out, so a backend need
    # not know the fleet's layout or the current pipeline. Unset pool: the first pool of
    # the catalogue whose machines have the slots the kind needs (resolved at load).
    # Unset pipeline version: a job of this kind must name its own.
    default_pool: str | None = Field(default=None, min_length=1, max_length=64)
    default_pipeline_version: str | None = Field(default=None, pattern=PIPELINE_VERSION)


class Catalog(BaseModel):
    plans: list[PlanSpec]
    workspaces: list[WorkspaceSpec]
    kinds: list[KindSpec]
    pools: list[PoolSpec]

    @model_validator(mode="after")
    def _references(self) -> Catalog:
        plan_ids = {p.id for p in self.plans}
        for ws in self.workspaces:
            if ws.plan not in plan_ids:
                raise ValueError(f"workspace {ws.id!r} names unknown plan {ws.plan!r}")
        seen: set[str] = set()
        for pool in self.pools:
            for off in pool.offerings:
                if off.id in seen:
                    raise ValueError(f"offering id {off.id!r} is used twice")
                seen.add(off.id)
        for kind in self.kinds:
            kind.default_pool = self._default_pool(kind)
        return self

    def _default_pool(self, kind: KindSpec) -> str | None:
        """The kind's named default pool, checked; else the first pool that fits it."""
        if kind.default_pool is None:
            return next((p.id for p in self.pools if kind.slots <= p.slots_per_machine), None)
        pool = self.pool(kind.default_pool)
        if pool is None:
            raise ValueError(f"kind {kind.id!r} names unknown default_pool {kind.default_pool!r}")
        if kind.slots > pool.slots_per_machine:
            raise ValueError(
                f"kind {kind.id!r} needs {kind.slots} slots; its default_pool {pool.id!r} has "
                f"{pool.slots_per_machine} a machine"
            )
        return pool.id

    def pool(self, pool_id: str) -> PoolSpec | None:
        return next((p for p in self.pools if p.id == pool_id), None)


# The pipeline version the embedded catalogue's kinds run when a job names none (the bundled
# sample pipeline installs under any version name).
SAMPLE_PIPELINE_VERSION = "2026.12.0"

DEFAULT_CATALOG = Catalog(
    plans=[
        PlanSpec(id="studio", tier=2, weight=2.0, max_gpu_jobs=4, rate_micros=1_000_000),
        PlanSpec(id="creator", tier=1, weight=1.0, max_gpu_jobs=2, rate_micros=1_200_000),
    ],
    workspaces=[
        WorkspaceSpec(id="acme-studio", plan="studio"),
        WorkspaceSpec(id="indie-creator", plan="creator"),
    ],
    kinds=[
        KindSpec(
            id="short_episode",
            slots=1,
            time_limit_s=3.5 * 3600,
            expected_duration_s=20 * 60,
            runs_writer_code=True,
            default_pipeline_version=SAMPLE_PIPELINE_VERSION,
        ),
        KindSpec(
            id="film",
            slots=0,
            time_limit_s=9 * 3600,
            expected_duration_s=4 * 3600,
            runs_writer_code=True,
            resumes_from_checkpoint=True,
            memory_limit_mb=32768,
            pids_limit=4096,
            default_pipeline_version=SAMPLE_PIPELINE_VERSION,
        ),
        KindSpec(
            id="clip",
            slots=1,
            time_limit_s=3600,
            expected_duration_s=5 * 60,
            runs_writer_code=False,
            memory_limit_mb=4096,
            default_pipeline_version=SAMPLE_PIPELINE_VERSION,
        ),
    ],
    pools=[
        PoolSpec(
            id="l4",
            slots_per_machine=2,
            max_machines=2,
            offerings=[
                OfferingSpec(
                    id="local-l4",
                    provider="LOCAL",
                    region="local",
                    zone="local-a",
                    instance_type="local-g2-standard-8",
                    slots=2,
                    hourly_price_micros=850_000,
                ),
            ],
        )
    ],
)


class CatalogError(ValueError):
    """The catalogue file is missing or invalid; the message says where."""


def load_catalog(path: str | Path | None) -> Catalog:
    """The catalogue in ``path`` (TOML), or the embedded default when ``path`` is None."""
    if path is None:
        return DEFAULT_CATALOG
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError as exc:
        raise CatalogError(f"catalogue file {p} not found") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"catalogue file {p}: {exc}") from exc
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        raise CatalogError(f"catalogue file {p}: {exc}") from exc
