"""The simulated world's objects: a machine (the control plane's row beside the truth the
simulator knows about it), a job and an attempt.

The row's fields are the ones the real scans read (``MachineSnapshot``, ``MachineView``);
the truth (when the agent came up, when start-up finished, whether the worker is alive,
whether the path to it is up, what the provider says) is what the three liveness channels
are computed from, lazily, at the moment a decision reads them — a channel is a function of
the truth and of its writer's cadence, so no heartbeat needs an event of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from gpufleet.scheduler.tick.model import AttemptView, JobView, MachineView
from gpufleet.sim.clock import EPOCH, Passes, dt
from gpufleet.sim.profile import Offering

INF = math.inf


@dataclass
class Attempt:
    id: str
    job: Job
    machine: Machine
    slots: tuple[int, ...]
    started: float
    state: str = "STARTING"  # STARTING, RUNNING, then an end state
    # The worker's last heartbeat for it is the machine's report clock; a lease is that
    # plus the scheduler's attempt lease.
    charged_micros: int = 0
    end_event: int = 0  # generation: an end scheduled for an older state is ignored
    view: AttemptView | None = None
    lease_from: datetime | None = None  # the report clock its view's lease was read from
    started_dt: datetime = EPOCH
    ended: float = INF  # when it ended (its slots may stay held past it: ``Machine.held``)
    # The control plane's process generation whose dispatch this is (``Sim.epoch``): an
    # answer or a give-up of an older one is nobody's (the process died in a restart).
    epoch: int = 0
    # The agent has taken it (a StartJob reached it): its job runs from then, once.
    handed_over: bool = False


@dataclass
class Job:
    id: str
    workspace: str
    plan: str
    pool: str
    kind: str
    slots_needed: int
    whole: bool
    tier: int
    weight: float
    created: float
    duration_s: float
    fails_own: bool
    time_limit_s: float
    expected_s: float
    state: str = "QUEUED"  # QUEUED, DISPATCHING/RUNNING (live attempt), SUCCEEDED, FAILED, TIMED_OUT
    queued_since: float = 0.0
    backoff_until: float = 0.0
    losses: int = 0  # the patient budget spent (our failures)
    disruptions: int = 0  # the disruption budget spent (ours, not the job's doing)
    failures: int = 0  # the ordinary budget spent (the job's own failures)
    live: Attempt | None = None
    first_start: float | None = None
    created_dt: datetime | None = None
    failed_our_side: bool = False
    paid_wait_opened: bool = False  # the paid-wait incident's flag (once per job, ever)
    view: JobView | None = None  # as the tick reads it while queued (its usage read anew)


@dataclass
class Failure:
    """One injected failure and when (whether) the system dealt with it."""

    cls: str
    at: float
    machine_id: str = ""
    caught_at: float | None = None
    caught_by: str = ""
    # Seconds of control-plane outage that overlapped its detection window.
    outage_s: float = 0.0
    # Seconds after it that the design holds every action back (a net's grace window after
    # its machine came up): its limit is at least this, plus the net's cadence.
    held_s: float = 0.0


@dataclass
class Machine:
    id: str
    offering: Offering
    ordinal: int
    # Where the machine leaves its id when its tick view is dropped or its live attempts
    # change: its pool's rows (``PoolRows.stale``), read at the next tick.
    stale: set[str] = field(default_factory=set, repr=False, compare=False)
    # -- the control plane's row --------------------------------------------------------
    state: str = "PROVISIONING"
    intent: str = "RUNNING"
    lost: bool = False
    cordoned: bool = False
    earmarked_for: str | None = None
    # Pinned by the fleet tick as its pool's warm capacity (the money chain refuses it).
    warm_held: bool = False
    # The timers the reaper's claim clears once its stop or destroy is done.
    clear_at_end: tuple[str, ...] = ()
    stop_due_at: datetime | None = None
    destroy_due_at: datetime | None = None
    requested_at: datetime | None = None
    provision_deadline_at: datetime | None = None
    state_changed_at: datetime | None = None
    startup_failed_at: datetime | None = None
    # The ledger rows written about this machine, by class (when each was written), as a
    # net reads them back: the stuck-transition net's re-issues and incidents, judged by
    # its own ``this_transition`` and ``opens_incident``.
    ledger_rows: dict[str, list[datetime]] = field(default_factory=dict)
    provider_instance_id: str | None = None
    # The create or start the row says is under way (the scale step's ``pending_call``),
    # and whether the provider has done it though no one read its answer (the process
    # that called died in a restart; the new leader's adopt re-issues it).
    pending_call: str | None = None
    done_unanswered: bool = False
    backoff_until: datetime | None = None
    dispatch_backoff_until: datetime | None = None
    # Dispatches in a row its agent did not answer (the scheduler's dispatch_failures).
    dispatch_failures: int = 0
    start_failures: int = 0
    preemptions: int = 0
    spot_seconds: float = 0.0
    attempts: dict[int, Attempt] = field(default_factory=dict)  # slot -> live attempt
    live_attempts: list[Attempt] = field(default_factory=list)  # each once
    # slot -> an attempt the control plane ended whose process the worker has not yet
    # reported gone (the row's ``holds_slot``): busy to the tick, live to no one.
    held: dict[int, Attempt] = field(default_factory=dict)
    # The report clock of an earlier life (a stopped and started machine keeps its row).
    earlier_report_at: datetime | None = None
    earlier_probe_ok_at: datetime | None = None
    # The provider channel's last listing of an earlier life, or of this one before its
    # instance went away (the column keeps it: the reconcile's "never listed" reads it).
    earlier_seen_at: datetime | None = None
    # The row's first_observed_at where a writer set it outright (a create's or start's
    # answer, a stuck transition finished to BOOTING) or its instance stopped running (the
    # column outlives what the truth below can still tell), over what the truth would say.
    recorded_first_observed: float = INF
    # The passes of the probe and provider channels' writers (the idle scanner and the
    # inventory reconcile, at the services' cadences, anew after a restart): the channels
    # move only when those passes run.
    probes: Passes = field(kw_only=True, repr=False, compare=False)
    listings: Passes = field(kw_only=True, repr=False, compare=False)
    # -- the truth -----------------------------------------------------------------------
    life: int = 0
    inst_status: str = ""  # "", PENDING, RUNNING, STOPPED, TERMINATED (the provider's word)
    run_since: float = INF  # this life's instance RUNNING since
    agent_up_at: float = INF  # the agent answers from here (this life)
    startup_done_at: float = INF  # the worker's first report (this life)
    worker_stopped_at: float = INF  # the worker died or wedged (it reports no more)
    gpu_stuck_busy: bool = False  # a wedged worker holds the GPU
    reachable_since: float = INF  # the path to the agent is up since (INF: down)
    unreachable_since: float = INF  # down since (INF: up, or never reached)
    skew_s: float = 0.0
    # This life's injected failures (a start begins a new life with a fresh worker).
    life_failures: list[Failure] = field(default_factory=list)
    bill_from: float | None = None
    seg_from: float = 0.0
    useful_from: float | None = None
    # The row as the fleet tick's snapshot reads it, kept while nothing it shows changed:
    # writing any field it is built from drops it (``__setattr__``; the slot map, changed
    # in place, is dropped by hand where it changes).
    view: MachineView | None = None

    def __setattr__(self, name: str, value: object) -> None:
        if name in VIEW_FIELDS:
            self.drop_view()
        object.__setattr__(self, name, value)

    @property
    def instance_id(self) -> str:
        """The id the simulated provider gives this machine's instance (its create's)."""
        return f"i-{self.id}"

    def drop_view(self) -> None:
        """The tick's view of the row (or of its live attempts) no longer holds."""
        object.__setattr__(self, "view", None)
        self.stale.add(self.id)

    # -- the three liveness channels, as their writers would have left them -------------

    def worker_report_at(self, now: float, heartbeat_s: float) -> datetime | None:
        """The scheduler stamps reports with its own clock, so a machine's skew never
        reaches this channel."""
        if self.startup_done_at > now:
            return self.earlier_report_at
        last = min(now, self.worker_stopped_at)
        return dt(last - (last - self.startup_done_at) % heartbeat_s)

    def reporting(self, now: float) -> bool:
        return self.startup_done_at <= now < self.worker_stopped_at

    def agent_reachable(self, t: float) -> bool:
        return self.reachable_since <= t and self.inst_status == "RUNNING"

    def probe_ok_at(self, now: float) -> datetime | None:
        if self.reachable_since <= now:
            first = self.probes.ceil(self.reachable_since)
            if first <= now:
                return dt(self.probes.floor(now))
            return self.earlier_probe_ok_at
        return self.earlier_probe_ok_at

    def probe_failed_since(self, now: float) -> datetime | None:
        if self.unreachable_since <= now and self.inst_status == "RUNNING":
            first = self.probes.ceil(self.unreachable_since)
            return dt(first) if first <= now else None
        if self.reachable_since > now and self.run_since <= now:
            first = self.probes.ceil(self.run_since)
            return dt(first) if first <= now else None
        return None

    def provider_seen_at(self, now: float) -> datetime | None:
        if self.run_since <= now:
            first = self.listings.ceil(self.run_since)
            if first <= now:
                return dt(self.listings.floor(now))
        return self.earlier_seen_at

    def first_observed(self, now: float) -> float:
        """When this platform first saw this life running: the first listing or probe (INF:
        not yet), as the inventory reconcile and the idle scanner write the column — a
        worker's report writes only its own clock, never ``first_observed_at``."""
        if self.recorded_first_observed < INF:
            return self.recorded_first_observed if self.recorded_first_observed <= now else INF
        t = INF
        if self.run_since < INF:
            t = self.listings.ceil(self.run_since)
        if self.reachable_since < INF:
            t = min(t, self.probes.ceil(self.reachable_since))
        return t if t <= now else INF

    def healthy_truth(self, now: float) -> bool:
        """Healthy by construction: its instance runs and nothing injected makes it useless
        (a dropped path or a skewed clock does not). A row whose create never made an
        instance is not a machine at all."""
        if self.inst_status != "RUNNING":
            return False
        return not any(f.cls in USELESS_CLASSES and f.at <= now for f in self.life_failures)


# The fields a machine's tick view is built from (its report clock from the last three).
VIEW_FIELDS = frozenset(
    {
        "state",
        "intent",
        "lost",
        "cordoned",
        "earmarked_for",
        "warm_held",
        "backoff_until",
        "dispatch_backoff_until",
        "preemptions",
        "spot_seconds",
        "attempts",
        "startup_done_at",
        "worker_stopped_at",
        "earlier_report_at",
    }
)

# What makes a machine useless: these are the failures a destroy is right for.
USELESS_CLASSES = frozenset({"provision_stall", "boot_never_completes", "worker_dies", "worker_wedges"})
