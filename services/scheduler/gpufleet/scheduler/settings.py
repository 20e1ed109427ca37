"""The scheduler's typed settings (env ``GPUFLEET_*``, optional TOML file)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator
from pydantic_settings import NoDecode

from gpufleet.common.job_lifecycle import RetryPolicy
from gpufleet.common.lease_fence import lease_violation
from gpufleet.common.settings import StoreSettings
from gpufleet.scheduler.checkpoint_location import CheckpointLocation, parse_checkpoint_location
from gpufleet.scheduler.gpu_faults import GpuFaultPolicy
from gpufleet.scheduler.tick.model import Policy
from gpufleet.scheduler.watchdogs.paid_wait import PaidWaitPolicy
from gpufleet.scheduler.watchdogs.stuck_dispatch import StuckDispatchPolicy


def _checkpoint_url(value: object) -> object:
    """Text from the environment or the file, parsed; empty means unset (a template's blank)."""
    if isinstance(value, str):
        return parse_checkpoint_location(value) if value.strip() else None
    return value


class Settings(StoreSettings):
    listen_address: str = "127.0.0.1:50051"
    # Prometheus scrapes its metrics here (README "Metrics"; `gpufleet up` writes the job).
    metrics_address: str = "127.0.0.1:9451"
    catalog_file: str | None = None
    # The fleet tick (demand -> scale -> assign -> limits -> leases), seconds of clock time.
    tick_s: float = Field(default=5.0, gt=0)
    # A worker's report renews its attempts' leases for this long. Machines stop a job
    # not renewed for half of it (docs/leases.md); it must exceed dispatch_deadline_s by
    # the margin lease_fence.lease_violation states, or the scheduler refuses to start.
    attempt_lease_s: float = Field(default=90.0, gt=0)
    # Only machines whose worker reported within this window are given new work.
    worker_fresh_s: float = Field(default=60.0, gt=0)
    # A fixed ceiling on machines running at once, over every pool.
    max_running_machines: int = Field(default=8, ge=0)
    provision_deadline_s: float = Field(default=1200.0, gt=0)
    # Back-off after a machine fails to start, doubled each time.
    start_backoff_s: float = Field(default=60.0, gt=0)
    # Back-off before a job whose attempt failed or was lost is dispatched again.
    retry_backoff_s: float = Field(default=10.0, ge=0)

    def tick_policy(self, max_running_machines: int | None = None) -> Policy:
        """What the fleet tick's decision reads from here, in one place: the scheduler's tick
        is built with it, and a simulated month's with the fleet ceiling it simulates
        (``max_running_machines``, else this setting's)."""
        return Policy(
            max_running_machines=(
                self.max_running_machines if max_running_machines is None else max_running_machines
            ),
            worker_fresh_s=self.worker_fresh_s,
            fair_share_quantum_s=self.fair_share_quantum_s,
            film_share=self.film_share,
        )

    def retry_policy(self) -> RetryPolicy:
        """The back-offs and the disruption budget every end of an attempt here decides by."""
        return RetryPolicy(self.retry_backoff_s, self.lost_retry_backoff_s, self.disruption_budget)

    # Fair share looks at GPU slot-seconds used over this window.
    fair_share_window_s: float = Field(default=86400.0, gt=0)
    # Within one tick, a workspace given a slot is charged this many slot-seconds before
    # the next pick (fair share re-evaluated as slots go out).
    fair_share_quantum_s: float = Field(default=900.0, ge=0)
    # While short jobs wait in a pool, films hold at most this share of its machines
    # (rounded down: a one-machine pool runs a film only when no short waits).
    film_share: float = Field(default=0.5, ge=0, le=1)
    # Job tokens (token_service.py): what one token may spend (micro-dollars), and how long
    # past its attempt's time limit it lives at most (it dies with its attempt anyway).
    token_spend_cap_micros: int = Field(default=20_000_000, ge=0)
    token_expiry_margin_s: float = Field(default=900.0, ge=0)
    # GPU health (gpu_faults.py): the same critical GPU fault on this many machines of one
    # offering within this window (clock seconds) quarantines the offering.
    gpu_fault_repeat_count: int = Field(default=2, ge=1)
    gpu_fault_repeat_window_s: float = Field(default=86400.0, gt=0)
    # Where checkpoints are kept (every scheduler process of a deployment must see the same
    # folder), and the largest one accepted.
    checkpoint_dir: str = "var/checkpoints"
    # Or, when set, a bucket: s3://bucket/prefix or gs://bucket/prefix (a folder path or
    # file:// URL also does), which scheduler pods share with no shared volume. It wins over
    # checkpoint_dir. Checked at load: a malformed one stops the process at start.
    checkpoint_url: Annotated[CheckpointLocation | None, NoDecode, BeforeValidator(_checkpoint_url)] = None
    checkpoint_max_bytes: int = Field(default=64 << 20, ge=1 << 10, le=1 << 30)
    # The tick's two bounded pools of workers: one makes the provider calls (create, start:
    # 30-60 s each at a cloud), the other the agent calls (StartJob, CancelJob: milliseconds).
    # Separate, so that no number of slow or hung creates can hold up a dispatch.
    provider_call_workers: int = Field(default=16, ge=1, le=512)
    dispatch_workers: int = Field(default=32, ge=1, le=512)
    # A provider call's deadline: longer than any driver's own bounded wait (the gcp driver
    # waits up to 120 s for an insert operation), so a slow create is answered, not cut off.
    provider_call_timeout_s: float = Field(default=300.0, gt=0)
    # An attempt whose StartJob has not succeeded by then is taken back, uncharged.
    dispatch_deadline_s: float = Field(default=30.0, gt=0)
    # A machine whose agent fails StartJob is not chosen again for this long, doubling per
    # failure in a row up to the cap.
    dispatch_backoff_s: float = Field(default=30.0, gt=0)
    dispatch_backoff_max_s: float = Field(default=600.0, gt=0)
    # Threads for the API's synchronous calls (JobService, FleetService), and the lane of
    # its own that the workers' reports (WorkerService) run on, which no other caller fills.
    # Those calls only touch the store (CancelJob tells agents from threads of its own), so
    # a few threads keep up: measured with 16 callers, 8 served SubmitJob 4-14 % faster than
    # 32 on PostgreSQL and SQLite, with a lower p99 (fewer threads contending for the GIL).
    api_workers: int = Field(default=8, ge=1, le=512)
    worker_lane_workers: int = Field(default=16, ge=1, le=512)
    # The request-level watchdogs (DESIGN §4): cadences and thresholds, seconds of clock time.
    queue_wait_every_s: float = Field(default=60.0, gt=0)
    no_consumer_every_s: float = Field(default=60.0, gt=0)
    stuck_dispatch_every_s: float = Field(default=60.0, gt=0)
    # A job DISPATCHING this long with no live attempt goes back to the queue (well past the
    # dispatch deadline, which owns the case where an attempt is still starting).
    stuck_dispatch_after_s: float = Field(default=300.0, gt=0)
    paid_wait_every_s: float = Field(default=60.0, gt=0)
    pool_idle_every_s: float = Field(default=900.0, gt=0)
    # A paid plan's job waiting this long for a GPU opens one incident.
    paid_wait_after_s: float = Field(default=1800.0, gt=0)
    # Processes serving the API on the listen port (PostgreSQL only); the first also runs
    # the fleet tick. See gpufleet.scheduler.api_processes for why and how.
    api_processes: int = Field(default=1, ge=1, le=64)
    # Set by the first process on the ones it starts (python -m gpufleet.scheduler --api-only).
    api_only: bool = False

    def checkpoint_location(self) -> CheckpointLocation:
        return self.checkpoint_url or CheckpointLocation.folder(self.checkpoint_dir)

    def gpu_fault_policy(self) -> GpuFaultPolicy:
        return GpuFaultPolicy(
            repeat_window=timedelta(seconds=self.gpu_fault_repeat_window_s),
            repeat_count=self.gpu_fault_repeat_count,
        )

    def stuck_dispatch_policy(self) -> StuckDispatchPolicy:
        return StuckDispatchPolicy(after=timedelta(seconds=self.stuck_dispatch_after_s))

    def paid_wait_policy(self) -> PaidWaitPolicy:
        return PaidWaitPolicy(after=timedelta(seconds=self.paid_wait_after_s))

    @model_validator(mode="after")
    def _lease_outlasts_the_machines_fence(self) -> Settings:
        # Machines stop a job whose lease was not renewed for half of it (lease_fence.py):
        # the other half must hold the first lease's hand-off and the job's stop.
        if (why := lease_violation(self.attempt_lease_s, self.dispatch_deadline_s)) is not None:
            raise ValueError(why)
        return self

    @model_validator(mode="after")
    def _api_processes_need_postgres(self) -> Settings:
        if self.api_processes > 1 and not self.database_url.startswith("postgresql"):
            raise ValueError(
                "api_processes > 1 needs PostgreSQL: SQLite has one writer at a time, and its "
                "writers queue best inside one process"
            )
        return self
