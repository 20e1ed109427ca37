"""SQLAlchemy 2 models for the whole gpufleet schema (DESIGN §2, §5, §6, §9).

The schema itself is owned by the Alembic migrations beside this file; these models
mirror it, and a test checks that the two never drift apart.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


# Every time is stored as timezone-aware UTC.
class UTCDateTime(TypeDecorator[datetime]):
    """A DateTime that always comes back timezone-aware (SQLite forgets the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime stored; use the injected Clock")
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            from datetime import UTC

            return value.replace(tzinfo=UTC)
        return value


Id = String(64)
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Plan(Base):
    __tablename__ = "plans"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    tier: Mapped[int] = mapped_column(Integer, default=0)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    max_gpu_jobs: Mapped[int] = mapped_column(Integer, default=1)
    rate_micros: Mapped[int] = mapped_column(BigInteger, default=1_000_000)


class Workspace(Base):
    __tablename__ = "workspaces"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    plan_id: Mapped[str] = mapped_column(ForeignKey("plans.id"))
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    # WorkspaceService.CreateWorkspace's idempotency key and the content it carried (a
    # workspace seeded from the catalogue file has none).
    request_id: Mapped[str | None] = mapped_column(String(128), unique=True)
    request_hash: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Pool(Base):
    __tablename__ = "pools"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    gpu_model: Mapped[str] = mapped_column(String(64))
    slots_per_machine: Mapped[int] = mapped_column(Integer)
    warm_target: Mapped[int] = mapped_column(Integer, default=0)
    max_machines: Mapped[int] = mapped_column(Integer, default=4)
    # The pool's idle clock: since when it has had no work (None while it has some). Idle
    # for idle_release_after_s, its warm capacity is released (warm_released) until work
    # comes back.
    idle_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    idle_release_after_s: Mapped[float] = mapped_column(Float, default=1800.0)
    warm_released: Mapped[bool] = mapped_column(Boolean, default=False)


class Offering(Base):
    __tablename__ = "offerings"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id"))
    rank: Mapped[int] = mapped_column(Integer, default=0)
    provider: Mapped[str] = mapped_column(String(16))
    region: Mapped[str] = mapped_column(String(64))
    zone: Mapped[str] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(64))
    gpu_model: Mapped[str] = mapped_column(String(64))
    gpu_count: Mapped[int] = mapped_column(Integer, default=1)
    slots: Mapped[int] = mapped_column(Integer)
    capacity_type: Mapped[str] = mapped_column(String(16))
    hourly_price_micros: Mapped[int] = mapped_column(BigInteger)


class JobKind(Base):
    __tablename__ = "job_kinds"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    # 0 means the whole machine (a film).
    slots: Mapped[int] = mapped_column(Integer, default=1)
    time_limit_s: Mapped[float] = mapped_column(Float)
    runs_writer_code: Mapped[bool] = mapped_column(Boolean, default=True)
    queue_wait_deadline_s: Mapped[float] = mapped_column(Float, default=86400.0)
    retry_budget: Mapped[int] = mapped_column(Integer, default=2)
    lost_retry_budget: Mapped[int] = mapped_column(Integer, default=5)
    resumes_from_checkpoint: Mapped[bool] = mapped_column(Boolean, default=False)
    # How long a job of this kind usually runs (None: its time limit, the bound): the film
    # drain reads it to find the machine whose jobs end soonest.
    expected_duration_s: Mapped[float | None] = mapped_column(Float)
    # The job's cgroup limits on the machine (the walls, DESIGN §10).
    memory_limit_mb: Mapped[int] = mapped_column(Integer, default=8192)
    pids_limit: Mapped[int] = mapped_column(Integer, default=1024)
    # What SubmitJob fills in when a job of this kind leaves them out (None: it must name it).
    default_pool: Mapped[str | None] = mapped_column(String(64))
    default_pipeline_version: Mapped[str | None] = mapped_column(String(64))


class Machine(Base):
    """The platform's record of one rented instance or one self-registered box."""

    __tablename__ = "machines"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    pool_id: Mapped[str | None] = mapped_column(ForeignKey("pools.id"))
    offering_id: Mapped[str | None] = mapped_column(Id)
    # Offering snapshot: what was bought, kept even if the catalogue changes.
    provider: Mapped[str] = mapped_column(String(16))
    region: Mapped[str] = mapped_column(String(64), default="")
    zone: Mapped[str] = mapped_column(String(64), default="")
    instance_type: Mapped[str] = mapped_column(String(64), default="")
    gpu_model: Mapped[str] = mapped_column(String(64), default="")
    gpu_count: Mapped[int] = mapped_column(Integer, default=1)
    slots: Mapped[int] = mapped_column(Integer, default=1)
    capacity_type: Mapped[str] = mapped_column(String(16), default="ON_DEMAND")
    hourly_price_micros: Mapped[int] = mapped_column(BigInteger, default=0)

    origin: Mapped[str] = mapped_column(String(16))
    managed: Mapped[bool] = mapped_column(Boolean, default=True)
    workload_class: Mapped[str] = mapped_column(String(16), default="REPORTING")
    state: Mapped[str] = mapped_column(String(16))
    intent: Mapped[str] = mapped_column(String(16))
    lost: Mapped[bool] = mapped_column(Boolean, default=False)
    cordoned: Mapped[bool] = mapped_column(Boolean, default=False)
    provider_instance_id: Mapped[str | None] = mapped_column(String(128))
    agent_address: Mapped[str | None] = mapped_column(String(256))

    provider_seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    probe_ok_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    probe_failed_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    worker_report_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    requested_at: Mapped[datetime] = mapped_column(UTCDateTime)
    provision_deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    first_observed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    state_changed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Boot failure: when a start-up failure was first seen (re-confirmed on a later tick).
    startup_failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    stop_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    destroy_due_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    preemption_count: Mapped[int] = mapped_column(Integer, default=0)
    spot_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    # Start back-off: a machine that failed to start is not tried again before this.
    start_failures: Mapped[int] = mapped_column(Integer, default=0)
    backoff_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The provider call the fleet tick handed to its call pool ("create" / "start"), set
    # before the call and cleared when its answer is recorded; a new leader re-issues it.
    pending_call: Mapped[str | None] = mapped_column(String(16))
    pending_call_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # StartJob failures in a row on this machine's agent, and the back-off they earned.
    dispatch_failures: Mapped[int] = mapped_column(Integer, default=0)
    dispatch_backoff_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Who made the last state change (gpufleet.common.lifecycle.Actor) and why.
    state_changed_by: Mapped[str] = mapped_column(String(16), default="")
    state_reason: Mapped[str] = mapped_column(String(500), default="")
    # The film this machine is held for (started for it, or DRAINING for it), and since
    # when; cleared when the film starts on it or no longer needs it.
    earmarked_for: Mapped[str | None] = mapped_column(Id)
    earmarked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # One of its pool's warm machines (the pool's warm_target, while not released): the
    # money chain does not stop or destroy it for being idle.
    warm_held: Mapped[bool] = mapped_column(Boolean, default=False)
    # Its GPUs' health as its worker last reported it (gpufleet.scheduler.gpu_faults):
    # unmonitored / ok / warning / critical (NULL: never reported), the findings (a list of
    # {kind, severity, gpu_index, code, message, first_seen, count}) and when it was read.
    gpu_health: Mapped[str | None] = mapped_column(String(16))
    gpu_findings: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    gpu_health_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        # Every scan excludes destroyed machines: partial indexes keep scans proportional
        # to the live fleet, not to history.
        Index(
            "ix_machines_live_state",
            "state",
            postgresql_where=text("state <> 'DESTROYED'"),
            sqlite_where=text("state <> 'DESTROYED'"),
        ),
        Index(
            "ix_machines_stop_due",
            "stop_due_at",
            postgresql_where=text("stop_due_at IS NOT NULL"),
            sqlite_where=text("stop_due_at IS NOT NULL"),
        ),
        Index(
            "ix_machines_destroy_due",
            "destroy_due_at",
            postgresql_where=text("destroy_due_at IS NOT NULL"),
            sqlite_where=text("destroy_due_at IS NOT NULL"),
        ),
        Index("ix_machines_pool", "pool_id"),
        Index("ix_machines_provider_instance", "provider", "provider_instance_id"),
    )


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    request_id: Mapped[str] = mapped_column(String(128), unique=True)
    # Hash of the submitted content: a reused request_id with other content is refused.
    request_hash: Mapped[str] = mapped_column(String(64))
    workspace_id: Mapped[str] = mapped_column(ForeignKey("workspaces.id"))
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id"))
    kind_id: Mapped[str] = mapped_column(ForeignKey("job_kinds.id"))
    pipeline_version: Mapped[str] = mapped_column(String(64))
    tenant_values: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Back-off after a lost or failed attempt: not dispatched before this.
    not_before: Mapped[datetime | None] = mapped_column(UTCDateTime)
    attempt_count: Mapped[int] = mapped_column(Integer, default=0)
    failure_retries_used: Mapped[int] = mapped_column(Integer, default=0)
    lost_retries_used: Mapped[int] = mapped_column(Integer, default=0)
    # Ends the job cannot have caused (gpufleet.common.job_lifecycle's disruptions).
    disruptions_used: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    status_message: Mapped[str] = mapped_column(Text, default="")
    slot_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    charge_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    paid_wait_incident: Mapped[bool] = mapped_column(Boolean, default=False)
    # Why it waits while QUEUED, as the fleet tick last decided it (a PendingReason name,
    # its words, and for a machine on its way when it is expected to take work); written
    # only when it changes, cleared when the job is assigned (migration 0014).
    pending_reason: Mapped[str | None] = mapped_column(String(32))
    pending_message: Mapped[str | None] = mapped_column(Text)
    pending_ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ix_jobs_state_created", "state", "created_at"),
        Index("ix_jobs_workspace", "workspace_id", "created_at"),
    )


class Attempt(Base):
    __tablename__ = "attempts"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    machine_id: Mapped[str] = mapped_column(ForeignKey("machines.id"))
    slot: Mapped[int] = mapped_column(Integer)
    # Slots held (a film holds every slot of its machine).
    slots: Mapped[int] = mapped_column(Integer, default=1)
    state: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    lease_expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    slot_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    charged: Mapped[bool] = mapped_column(Boolean, default=False)
    charge_micros: Mapped[int] = mapped_column(BigInteger, default=0)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    status_message: Mapped[str] = mapped_column(Text, default="")
    # Who owns the attempt's row for writes: the epoch of the leader that created it.
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    # Ended here, but its process may still run on the machine (cancelled, timed out,
    # taken back): the slot stays held until the machine's worker reports it gone.
    holds_slot: Mapped[bool] = mapped_column(Boolean, default=False)
    # The checkpoint it started from (a kind that resumes from checkpoints), if any.
    checkpoint_id: Mapped[str | None] = mapped_column(Id)

    __table_args__ = (
        Index(
            "ix_attempts_live",
            "state",
            "lease_expires_at",
            postgresql_where=text("state IN ('STARTING','RUNNING')"),
            sqlite_where=text("state IN ('STARTING','RUNNING')"),
        ),
        Index("ix_attempts_machine", "machine_id", "state"),
        Index("ix_attempts_job", "job_id"),
    )


class Checkpoint(Base):
    """A job's saved progress, written by one of its attempts and kept by the control
    plane: the bytes in the checkpoint store (``GPUFLEET_CHECKPOINT_DIR``), named by id."""

    __tablename__ = "checkpoints"
    id: Mapped[str] = mapped_column(Id, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id"))
    sequence: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # Its bytes were removed, replaced by newer checkpoints; the row stays, so an attempt
    # still shows which checkpoint it started from.
    discarded_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (UniqueConstraint("job_id", "sequence", name="uq_checkpoints_job_sequence"),)


class JobToken(Base):
    """A token an attempt was given (DESIGN §10): its SHA-256 only — the token itself
    leaves the scheduler once, in the StartJob call — with whom it names, what it may spend
    and spent, and when it expires. It is refused the moment its attempt stops running."""

    __tablename__ = "job_tokens"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    scope: Mapped[str] = mapped_column(String(16))
    workspace_id: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    attempt_id: Mapped[str] = mapped_column(ForeignKey("attempts.id"))
    spend_cap_micros: Mapped[int] = mapped_column(BigInteger)
    spent_micros: Mapped[int] = mapped_column(BigInteger, default=0, server_default=text("0"))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_job_tokens_attempt", "attempt_id"),)


class JobEvent(Base):
    """Each change of a job's state, in order: what WatchJob streams."""

    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"))
    state: Mapped[str] = mapped_column(String(16))
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    message: Mapped[str] = mapped_column(Text, default="")

    __table_args__ = (Index("ix_job_events_job", "job_id", "id"),)


class Failure(Base):
    """The append-only failure ledger (a PostgreSQL trigger refuses UPDATE and DELETE)."""

    __tablename__ = "failures"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    machine_id: Mapped[str | None] = mapped_column(Id)
    job_id: Mapped[str | None] = mapped_column(Id)
    attempt_id: Mapped[str | None] = mapped_column(Id)
    failure_class: Mapped[str] = mapped_column(String(64))
    detector: Mapped[str] = mapped_column(String(64))
    details: Mapped[str] = mapped_column(Text, default="")
    outcome: Mapped[str] = mapped_column(String(32))

    __table_args__ = (
        Index("ix_failures_machine", "machine_id", "id"),
        Index("ix_failures_class", "failure_class", "id"),
    )


class Incident(Base):
    __tablename__ = "incidents"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    failure_class: Mapped[str] = mapped_column(String(64))
    machine_id: Mapped[str | None] = mapped_column(Id)
    job_id: Mapped[str | None] = mapped_column(Id)
    summary: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16), default="OPEN")
    acknowledged_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    acknowledged_by: Mapped[str | None] = mapped_column(String(128))
    resolved_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Opens at most one incident per key (e.g. one paid-wait incident per job).
    dedupe_key: Mapped[str | None] = mapped_column(String(200), unique=True)


class Quarantine(Base):
    __tablename__ = "quarantines"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(24))
    offering_id: Mapped[str | None] = mapped_column(Id)
    provider: Mapped[str | None] = mapped_column(String(16))
    region: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    cleared_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class LeaderLease(Base):
    """One row per timer-driven service: who leads, until when, under which epoch."""

    __tablename__ = "leader_leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    epoch: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)


class WatchdogStat(Base):
    """A watchdog's cadence, last run and counts, for ReaperService.ListWatchdogs."""

    __tablename__ = "watchdog_stats"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    service: Mapped[str] = mapped_column(String(32))
    cadence_s: Mapped[float] = mapped_column(Float)
    last_run_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    runs: Mapped[int] = mapped_column(BigInteger, default=0)
    actions: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)
    refusals: Mapped[dict[str, int]] = mapped_column(JSON, default=dict)


class Sweep(Base):
    """One run of a sweeper pass (inventory reconcile, later the orphan sweep), for ListSweeps.

    ``request_id`` makes a manual RunSweep idempotent: the same id returns the same sweep.
    """

    __tablename__ = "sweeps"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(String(32))
    request_id: Mapped[str | None] = mapped_column(String(128), unique=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    instances_seen: Mapped[int] = mapped_column(Integer, default=0)
    machines_updated: Mapped[int] = mapped_column(Integer, default=0)
    orphans_seen: Mapped[int] = mapped_column(Integer, default=0)
    orphans_destroyed: Mapped[int] = mapped_column(Integer, default=0)
    # Providers that could not be listed this time (names, e.g. ["AWS"]).
    unreachable: Mapped[list[str]] = mapped_column(JSON, default=list)
    summary: Mapped[str] = mapped_column(Text, default="")

    __table_args__ = (Index("ix_sweeps_kind", "kind", "id"),)


# --- reaper nets (issue 3): models added by that work go below this line ---

from sqlalchemy import case, literal_column  # noqa: E402

# One partial index per machine-level net's scan (migration 0003), so a pass of every
# watchdog reads the machines due, not the fleet's history. Declared here, beside the
# table, with the migration's exact predicates.
_LIVE = "state <> 'DESTROYED'"
_RUNNING = "state IN ('BOOTING', 'DRAINING', 'READY')"
_PRE_CONTACT = "state IN ('BOOTING', 'PROVISIONING', 'REQUESTED')"
_TRANSITIONAL = "state IN ('DESTROYING', 'PROVISIONING', 'STARTING', 'STOPPING')"


def _machines_partial_index(name: str, column: Any, where: str) -> Index:
    return Index(name, column, postgresql_where=text(where), sqlite_where=text(where))


REAPER_NET_INDEXES = (
    _machines_partial_index(
        "ix_machines_running_unreported",
        Machine.first_observed_at,
        f"{_RUNNING} AND (worker_report_at IS NULL OR worker_report_at < first_observed_at)",
    ),
    # Went silent's report clock: an expression index (not partial) so PostgreSQL keeps
    # statistics on it and reads only the silent running machines (see migration 0003).
    Index(
        "ix_machines_running_report_clock",
        case(
            (
                Machine.state.in_([literal_column(f"'{s}'") for s in ("BOOTING", "DRAINING", "READY")]),
                Machine.worker_report_at,
            )
        ),
    ),
    _machines_partial_index(
        "ix_machines_pre_contact_deadline",
        Machine.provision_deadline_at,
        f"{_PRE_CONTACT} AND probe_ok_at IS NULL AND worker_report_at IS NULL",
    ),
    _machines_partial_index(
        "ix_machines_probe_failing", Machine.probe_failed_since, f"probe_failed_since IS NOT NULL AND {_LIVE}"
    ),
    _machines_partial_index("ix_machines_lost", Machine.id, f"lost AND {_LIVE}"),
    _machines_partial_index("ix_machines_transitional", Machine.state_changed_at, _TRANSITIONAL),
    # gpu_fault (migration 0016): a critical GPU state, or a cordon.
    _machines_partial_index(
        "ix_machines_gpu_faulted", Machine.id, f"{_LIVE} AND (gpu_health = 'critical' OR cordoned)"
    ),
)


# --- sweeper orphan sweep (issue 4): models added by that work go below this line ---


class Orphan(Base):
    """An instance labelled with our deployment that had no machine record here when an
    orphan sweep saw it (DESIGN §4). ``first_seen_at`` is one of the grace window's two
    clocks (the provider's ``launch_time`` is the other); ``action`` is what the sweeper
    did about it: WAITING (inside its grace window), DESTROYING (intent recorded, call
    made or about to be), DESTROYED, GONE (it went away by itself), RECORDED (a machine
    record matches it after all), NEEDS_HUMAN (no machine label: the provisioner cannot
    address it).
    """

    __tablename__ = "orphans"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    provider: Mapped[str] = mapped_column(String(16))
    provider_instance_id: Mapped[str] = mapped_column(String(128))
    machine_label: Mapped[str | None] = mapped_column(String(64))
    # Where it runs: what a destroy through the provisioner needs to route the call.
    region: Mapped[str] = mapped_column(String(64), default="")
    zone: Mapped[str] = mapped_column(String(64), default="")
    instance_type: Mapped[str] = mapped_column(String(64), default="")
    capacity_type: Mapped[str] = mapped_column(String(16), default="ON_DEMAND")
    # The provider's last word on it (PENDING, RUNNING, STOPPED, ...).
    status: Mapped[str] = mapped_column(String(16), default="")
    launch_time: Mapped[datetime | None] = mapped_column(UTCDateTime)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime)
    destroyed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    action: Mapped[str] = mapped_column(String(16))
    action_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        Index("ux_orphans_instance", "provider", "provider_instance_id", unique=True),
        Index("ix_orphans_action", "action"),
    )


class ProviderListing(Base):
    """Whether the orphan sweep could read each provider's list, round after round.

    ``provider`` is a provider name, or ``PROVISIONER`` when the provisioner itself could
    not be reached (then no provider could be listed). ``failed_rounds`` counts sweeps in a
    row that could not list it; an incident opens when it reaches the configured number.
    """

    __tablename__ = "provider_listings"
    provider: Mapped[str] = mapped_column(String(16), primary_key=True)
    failed_rounds: Mapped[int] = mapped_column(Integer, default=0)
    failing_since: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_listed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str] = mapped_column(Text, default="")
