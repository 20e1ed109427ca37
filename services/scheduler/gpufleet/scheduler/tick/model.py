"""The immutable views the fleet tick decides over."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta

# A queued job is near its queue-wait deadline once it has waited this share of it.
DEADLINE_NEAR_SHARE = 0.9


@dataclass(frozen=True)
class Pending:
    """Why a queued job waits, as the tick decided it: a ``PendingReason`` name (the proto's,
    without its prefix), the words for a person, and — for a job waiting for a machine on
    its way — when that machine is expected to take work."""

    reason: str
    message: str
    ready_at: datetime | None = None


@dataclass(frozen=True)
class JobView:
    id: str
    workspace_id: str
    pool_id: str
    kind_id: str
    # Slots this job needs on one machine (a film: every slot of a pool machine).
    slots_needed: int
    whole_machine: bool
    tier: int
    weight: float
    created_at: datetime
    # GPU slot-seconds the workspace used over the fair-share window.
    usage: float
    # When its current wait began and its kind's queue-wait deadline (0: none known): the
    # deadline-near reason reads them.
    waiting_since: datetime | None = None
    queue_wait_deadline_s: float = 0.0
    # Why it waits as last recorded (None: nothing recorded): a reason is written only
    # when it changes.
    pending: Pending | None = None


@dataclass(frozen=True)
class HeldBackJob:
    """A queued job the tick does not decide over, whose recorded reason is not yet the one
    its holding back implies: its workspace is paused, it waits out a dispatch back-off
    (``not_before``), or older jobs of its workspace already take its plan's places
    (beyond ``queued_read_bound``). Read only until that reason is recorded."""

    id: str
    workspace_id: str
    workspace_active: bool
    not_before: datetime | None
    waiting_since: datetime | None = None
    queue_wait_deadline_s: float = 0.0
    pending: Pending | None = None


@dataclass(frozen=True)
class MachineView:
    id: str
    pool_id: str | None
    state: str
    intent: str
    origin: str
    managed: bool
    lost: bool
    cordoned: bool
    slots: int
    busy_slots: frozenset[int]
    worker_report_at: datetime | None
    hourly_price_micros: int
    capacity_type: str
    preemption_count: int
    spot_seconds: float
    backoff_until: datetime | None
    agent_address: str | None
    # Not given new work before this: its agent kept failing StartJob.
    dispatch_backoff_until: datetime | None = None
    # The film this machine is held for (started for it, or DRAINING for it).
    earmarked_for: str | None = None
    # One of its pool's warm machines: the money chain leaves it running.
    warm_held: bool = False
    # Who rents it (AWS, GCP, LOCAL, SIM): read for the machines gauge, decides nothing.
    provider: str = ""
    # GPUs it has (its offering's, when bought): read for the GPU-seconds billed, decides nothing.
    gpu_count: int = 1
    # Its offering, and when its state last changed: when a machine on its way is expected
    # to take work is read from them (a job's expected ready time), decides nothing.
    offering_id: str | None = None
    state_changed_at: datetime | None = None

    @property
    def free_slots(self) -> list[int]:
        return [s for s in range(self.slots) if s not in self.busy_slots]


@dataclass(frozen=True)
class OfferingView:
    id: str
    pool_id: str
    rank: int
    provider: str
    region: str
    zone: str
    slots: int
    capacity_type: str
    hourly_price_micros: int


@dataclass(frozen=True)
class AttemptView:
    id: str
    job_id: str
    machine_id: str
    state: str
    started_at: datetime
    lease_expires_at: datetime
    slots: int
    time_limit_s: float
    # How long its kind usually runs (its time limit when the kind does not say).
    expected_s: float = 0.0
    # A film's attempt: it holds the whole machine.
    whole_machine: bool = False

    @property
    def expected_end(self) -> datetime:
        return self.started_at + timedelta(seconds=self.expected_s or self.time_limit_s)


@dataclass(frozen=True)
class PoolView:
    id: str
    slots_per_machine: int
    max_machines: int
    # Machines kept running while the pool has work (until its idle release).
    warm_target: int = 0
    idle_since: datetime | None = None
    warm_released: bool = False


@dataclass(frozen=True)
class FleetSnapshot:
    now: datetime
    # Queued jobs whose back-off has passed and whose workspace is active, oldest first.
    queued: list[JobView]
    # Live attempts per workspace and each workspace's plan limit.
    running_per_workspace: dict[str, int]
    workspace_limits: dict[str, int]
    machines: list[MachineView]
    pools: dict[str, PoolView]
    offerings: list[OfferingView]
    live_attempts: list[AttemptView]
    quarantined_offerings: frozenset[str] = frozenset()
    halted_regions: frozenset[tuple[str, str]] = frozenset()
    # The offerings the provisioner serves (its configured providers), as the no-consumer
    # detector last read them; None until it has: nothing is filtered then.
    served_offerings: frozenset[str] | None = None
    # Each workspace's plan tier, and the slot-seconds each used over the fair-share window
    # (what its queued jobs' ``usage`` is): read for the metrics, decide nothing.
    workspace_tiers: dict[str, int] = field(default_factory=dict)
    usage_per_workspace: dict[str, float] = field(default_factory=dict)
    # Queued jobs the tick holds back whose reason is not recorded yet (see HeldBackJob).
    held_back: list[HeldBackJob] = field(default_factory=list)
    # What the leader has seen of its machines' boots (:mod:`~gpufleet.scheduler.tick.boot_times`):
    # when each machine on its way began arriving, and each offering's typical boot in
    # seconds. Empty: the machine's state change and the policy's default stand in.
    arriving_since: dict[str, datetime] = field(default_factory=dict)
    typical_boot_s: dict[str, float] = field(default_factory=dict)
    # Machines that hold room under the fleet's ceiling (``decide.holds_room``) in pools this
    # snapshot leaves out. The tick reads the whole fleet: 0. A reader that decides one pool
    # at a time (the simulator, whose pools share nothing else a tick reads) gives the other
    # pools' count, so the fleet's ceiling — and the reason a job waits at it — is the one
    # ceiling the whole-fleet decision would apply.
    room_held_elsewhere: int = 0


@dataclass(frozen=True)
class Policy:
    max_running_machines: int
    worker_fresh_s: float
    # Prior pre-emptions an hour for a spot offering with no history of its own.
    spot_preemption_prior_per_hour: float = 0.05
    # Slot-seconds a workspace is charged, within one tick, for each slot it is given, so
    # that the next pick already sees it: one workspace with little history cannot take
    # every free slot of a tick. About a typical job's length (traces: p50 10-20 min).
    fair_share_quantum_s: float = 900.0
    # While short jobs wait in a pool, films hold at most this share of its live machines.
    film_share: float = 0.5
    # A machine's boot, request to ready, when nothing of its offering was seen boot yet.
    typical_boot_s: float = 180.0
    # A queued job is near its queue-wait deadline once it has waited this share of it.
    deadline_near_share: float = DEADLINE_NEAR_SHARE


@dataclass(frozen=True)
class StartMachine:
    machine_id: str
    # The film it is started for: earmarked, so no short takes it.
    for_job: str | None = None


@dataclass(frozen=True)
class CreateMachine:
    offering_id: str
    pool_id: str
    for_job: str | None = None


@dataclass(frozen=True)
class Drain:
    """Let ``machine_id``'s jobs finish, give it no new one, then start the film there."""

    machine_id: str
    job_id: str
    # When its jobs are expected to end (the reason it was chosen).
    ends_at: datetime


@dataclass(frozen=True)
class PoolClock:
    """The pool's idle clock moves: work came back (``busy``: the clock stops and its warm
    capacity is held again) or the pool just ran out of work (the clock starts)."""

    pool_id: str
    busy: bool


@dataclass(frozen=True)
class WarmPin:
    machine_id: str
    held: bool


@dataclass(frozen=True)
class Release:
    """An earmark that no longer serves its film: the machine is ordinary capacity again."""

    machine_id: str
    job_id: str
    why: str


@dataclass(frozen=True)
class PendingChange:
    """A waiting job's reason to record (None: clear it); ``reason_changed``: its reason
    itself changed, not only its words or time (WatchJob is told then)."""

    job_id: str
    pending: Pending | None
    reason_changed: bool


@dataclass(frozen=True)
class Assignment:
    job_id: str
    machine_id: str
    slots: tuple[int, ...]


@dataclass(frozen=True, order=True)
class ScaleCandidate:
    """One way to add a machine to a pool, ordered cheapest first: expected cost an hour,
    then a stopped machine (warm disk) before a new one, then a stable key."""

    expected_cost_micros: float
    creates: bool
    key: str
    action: StartMachine | CreateMachine = field(compare=False)
    # A machine that keeps being taken back (pre-empted before) waits behind a cheaper offering.
    risky: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class TickPlan:
    scale: list[StartMachine | CreateMachine] = field(default_factory=list)
    assignments: list[Assignment] = field(default_factory=list)
    expired_leases: list[str] = field(default_factory=list)
    over_limit: list[str] = field(default_factory=list)
    drains: list[Drain] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)
    # Why films that got nothing this tick wait (counted in the tick's report).
    film_waits: Counter[str] = field(default_factory=Counter)
    pool_clocks: list[PoolClock] = field(default_factory=list)
    warm_pins: list[WarmPin] = field(default_factory=list)
    # The waiting jobs whose reason changed (written by the assign step's commit).
    pending: list[PendingChange] = field(default_factory=list)
