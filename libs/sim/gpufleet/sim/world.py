"""One simulated month: the provider, the machines, the workers and the control plane, on a
virtual clock, with the project's real decisions.

The decisions are imported, never restated: the fleet tick's ``decide`` (per pool, over a
``FleetSnapshot`` built from the rows), every reaper net's ``decide`` over a
``MachineSnapshot`` (so the refusal ladder is the real one), the sweeper's reconcile and
orphan decisions, the ledger's routing table and the lifecycle's transition table (every
move is checked against it). What the simulator owns is what the database, the network
and the cloud would do: which rows a scan would read (each net's ``due`` clause, kept as
a schedule of when a row can first match it, so empty time costs nothing), what a provider
call answers, and what the truth of each machine is.

The month is a discrete-event loop: it jumps from one event to the next, and runs a pool's
fleet tick only when an event touched something the tick may decide on (or a clock the
tick reads passes a gate), a net's pass only when a row can be due in its scan. A month
run with ``evaluate_everything`` — every pool at every tick, every net at every cadence —
is the same month, bit for bit (tests/sim/test_event_driven.py).
"""

from __future__ import annotations

import gc
import heapq
import math
import random
from bisect import bisect_left, bisect_right, insort
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from itertools import accumulate
from typing import Any, Literal, ParamSpec

from gpufleet.common import idle_timers, lifecycle, spot_history
from gpufleet.common import nets as net_registry
from gpufleet.common.attempts import replacement
from gpufleet.common.call_failures import Op, decide_call_failure
from gpufleet.common.catalog import DEFAULT_CATALOG, PlanSpec
from gpufleet.common.db.enums import (
    LIVE_ATTEMPT_STATES,
    RUNNING_STATES,
    TRANSITIONAL_STATES,
    AttemptState,
    CapacityType,
    JobState,
    MachineIntent,
    MachineState,
    QuarantineKind,
)
from gpufleet.common.errors import GpufleetError, Unavailable
from gpufleet.common.job_lifecycle import (
    OUR_FAILURES,
    EndCause,
    IllegalJobTransition,
    JobCounters,
    JobUpdate,
    Mover,
    RetryPolicy,
    charge_micros,
    check_attempt_move,
    check_cause,
    check_job_move,
    decide_attempt_end,
    lease_expiry_cause,
)
from gpufleet.common.ledger import (
    FailureClass,
    OutcomeTarget,
    decide_effect,
    in_force,
    replace_cause,
    route,
)
from gpufleet.common.nets import Service
from gpufleet.common.outcome_policy import OutcomePolicy
from gpufleet.common.provider_errors import AuthFailed, InsufficientCapacity, QuotaExceeded, Transient
from gpufleet.reaper import (
    auto_destroy,
    auto_stop,
    boot_failure,
    idle_scanner,
    lost_detector,
    provision_deadline,
    stuck_transition,
    went_silent,
)
from gpufleet.reaper.agent_probe import StartupProbe
from gpufleet.reaper.net_runner import A, Claim, OneStepSpec, P
from gpufleet.reaper.refusal import MachineSnapshot, NetGates, RefusalReason, Refuse, first_refusal
from gpufleet.reaper.transition import Transition, destroy_transition
from gpufleet.scheduler.tick import decide as tick_decide
from gpufleet.scheduler.tick import limits
from gpufleet.scheduler.tick.dispatch_failure import (
    BACKS_OFF,
    DISPATCH_TOOK,
    DispatchFailure,
    backed_off,
    overdue,
    unanswered,
)
from gpufleet.scheduler.tick.earmark_updates import EarmarkRow, EarmarkUpdate, films_started, plan_updates
from gpufleet.scheduler.tick.films import WAIT_SHARE_CAP
from gpufleet.scheduler.tick.model import (
    CreateMachine,
    FleetSnapshot,
    JobView,
    OfferingView,
    PoolView,
    StartMachine,
    TickPlan,
)
from gpufleet.scheduler.tick.scale import (
    CREATE,
    START,
    answered_values,
    create_values,
    is_definitive,
    refusal_class,
    start_values,
)
from gpufleet.scheduler.tick.wake import next_wake
from gpufleet.scheduler.tick.warm import clock_values
from gpufleet.scheduler.watchdogs import common as watchdog_common
from gpufleet.scheduler.watchdogs import paid_wait, pool_idle, queue_wait
from gpufleet.sim.clock import EPOCH, EventQueue, Passes, dt, grid_after, secs
from gpufleet.sim.fair_share import WindowUsage, next_order_change
from gpufleet.sim.fairness import FairnessLedger
from gpufleet.sim.nets import NetSettings
from gpufleet.sim.profile import Offering, ScriptedJob, SimConfig, load_offerings
from gpufleet.sim.records import INF, USELESS_CLASSES, Attempt, Failure, Job, Machine
from gpufleet.sim.tick_rows import PoolRows
from gpufleet.sweeper import inventory_reconcile, orphan_sweep
from gpufleet.sweeper.listing import ListedInstance
from gpufleet.sweeper.machine_loss import MachineLoss, classify_loss, loss_update
from gpufleet.sweeper.orphan_rows import OrphanAction

POLICIES = ("nets", "oracle", "merged")
# The services that write ledger rows, each under its own settings' outcome policy.
Writer = Literal["scheduler", "reaper", "sweeper"]
# Who makes a provider call: a service's process (which a restart, or for the reaper a
# pause, can take its answer from), the oracle or a human (outside the control plane).
Caller = Literal["scheduler", "reaper", "oracle", "human"]
# The columns a shared update may write that the simulator does not keep: the agent's
# address (its machines have none) and when a call was made pending, the failing probes'
# streak (read from each life's truth, which a new life resets), and when an earmark was
# set (only the API and the CLI show it; no decision reads it).
# The columns kept on the simulator's machine under the row's own name and type.
_AS_IS = frozenset(
    {
        "intent",
        "lost",
        "cordoned",
        "requested_at",
        "provision_deadline_at",
        "state_changed_at",
        "startup_failed_at",
        "provider_instance_id",
        "pending_call",
        "backoff_until",
        "start_failures",
        "dispatch_failures",
        "dispatch_backoff_until",
        "spot_seconds",
        "earmarked_for",
    }
)
_NOT_KEPT = frozenset({"agent_address", "pending_call_at", "probe_failed_since", "earmarked_at"})
# The counterfactual policy's one composite check: no service runs it, so it is not in the
# net registry; it stands in for the nets in MERGED_REPLACES, at went silent's cadence.
MERGED_CHECK = "merged_check"
# The ledger classes the stuck-transition net reads back, per machine (``Machine.ledger_rows``).
_REISSUED = FailureClass.TRANSITION_REISSUED.value
_STUCK = FailureClass.TRANSITION_STUCK.value
MERGED_REPLACES = frozenset({"provision_deadline", "boot_failure", "went_silent", "lost_detector"})


# The intent a provider call is made under (the scale step's create and start values, a
# stop or destroy transition's).
_INTENT_OF_CALL = {
    CREATE: create_values(None, EPOCH, 0.0)["intent"],
    START: start_values(None, EPOCH)["intent"],
    auto_stop.STOP.operation: auto_stop.STOP.intent,
    "destroy": destroy_transition(auto_destroy.NAME).intent,
}

# A lifecycle check's arguments (Sim._checked).
Move = ParamSpec("Move")


def _job_id(job: Job) -> str:
    return job.id


DEPLOYMENT = "sim"
# The catalogue's plans (tier, weight, rate: what the tick orders by and a charge is priced
# at), with caps on GPU jobs at once for a fleet of hundreds of machines rather than the
# embedded default's two; and a free plan the month adds (the lowest tier, half a weight,
# the catalogue's default rate).
_CAPS = {"studio": 32, "creator": 8, "free": 2}
PLANS: dict[str, PlanSpec] = {
    p.id: p.model_copy(update={"max_gpu_jobs": _CAPS[p.id]})
    for p in (*DEFAULT_CATALOG.plans, PlanSpec(id="free", tier=0, weight=0.5))
}
KINDS = {k.id: k for k in DEFAULT_CATALOG.kinds}
SLOTS_PER_MACHINE = 2


class InvariantBroken(AssertionError):
    """A rule the money path must keep was broken; the message names the seed."""


@dataclass
class Metrics:
    billed_s: float = 0.0
    useful_s: float = 0.0
    cost_micros: float = 0.0
    # Attempts ended, by their cause (the job lifecycle's EndCause).
    attempt_ends: Counter[str] = field(default_factory=Counter)
    # What tenants were charged, by plan (the charged attempts' prices at their plan's rate).
    charged_micros: Counter[str] = field(default_factory=Counter)
    wasted_micros: float = 0.0
    healthy_destroys: int = 0
    jobs_run_twice_at_once: int = 0
    # Jobs the queue-wait timeout failed (waited past their kind's deadline).
    queue_wait_timeouts: int = 0
    decisions: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    waits: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    # Hourly samples for the charts: (t, machines by state, billed_s, useful_s).
    samples: list[tuple[float, dict[str, int], float, float]] = field(default_factory=list)
    idle_by_cause: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    provider_calls: int = 0
    calls_without_intent: int = 0


# A definitive refusal's injected failure class and its ledger class (the rest of a failed
# call is provider_call_failed, as the scale step classes it).
_REFUSAL_FAILURE = {"stockout": "stockout", "quota": "quota_error", "auth": "auth_error"}
# What the scale step's create or start call raises for each answer the simulated provider
# gives (a call that did nothing, or whose answer was lost, is not a refusal): the scale
# step's own ``refusal_class`` and ``is_definitive`` read it.
_ANSWER_ERROR: dict[str, type[GpufleetError]] = {
    "stockout": InsufficientCapacity,
    "quota": QuotaExceeded,
    "auth": AuthFailed,
    "refused": Transient,
    "lost": Unavailable,  # the client reads a call that timed out so (grpcclient)
}


class Sim:
    """One policy over one seed. ``policy``: ``nets`` (the real five nets), ``oracle``
    (each failure dealt with the instant it happens) or ``merged`` (one composite health
    check in place of the provision deadline, boot failure, went silent and lost nets)."""

    def __init__(
        self,
        config: SimConfig,
        policy: str = "nets",
        plant: str | None = None,
        settings: NetSettings | None = None,
        evaluate_everything: bool = False,
        wake_from_plan: bool = False,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, not {policy!r}")
        self.cfg = config
        self.policy = policy
        self.plant = plant
        # Every pool's tick at every tick cadence and every net's pass at every cadence,
        # instead of only those an event touched or a clock made due: slower, and the same
        # month bit for bit (a test holds the two to it).
        self.evaluate_everything = evaluate_everything
        # Also wake each pool at its decision's own requeue-after (the scheduler's
        # ``tick.wake.next_wake``): the clocks the world wakes the tick for itself (a
        # worker's last report, a back-off's end, a time limit) must cover every gate that
        # names, so the month is the same (a test holds it); it costs a quarter more time,
        # as the decision cannot know a heartbeat will come and wakes for each staleness.
        self.wake_from_plan = wake_from_plan
        self.q = EventQueue()
        self.end = config.days * 86400.0
        self.metrics = Metrics()
        self.failures: list[Failure] = []
        self.script = config.script
        self.offerings = [self.script.offering] if self.script is not None else load_offerings()
        # Each machine's and job's states with when it took them (a scripted world's, which
        # the simulator-vs-services comparison reads; off otherwise: nothing is kept).
        self.history: list[tuple[float, str, str, str]] | None = [] if self.script is not None else None
        self.offering_by_id = {o.id: o for o in self.offerings}
        # The catalogue's offerings as the tick reads them: the same every tick.
        self.offering_views: dict[str, list[OfferingView]] = defaultdict(list)
        for i, o in enumerate(self.offerings):
            self.offering_views[o.pool].append(
                OfferingView(
                    id=o.id,
                    pool_id=o.pool,
                    rank=i,
                    provider=o.provider,
                    region=o.region,
                    zone=o.zone,
                    slots=SLOTS_PER_MACHINE,
                    capacity_type=o.capacity_type,
                    hourly_price_micros=o.hourly_price_micros,
                )
            )
        self.pools = sorted({o.pool for o in self.offerings})
        # Each pool as the tick reads it (one pool a decision): its warm target, and its idle
        # clock and warm release as the tick and the pool idle release write them.
        self.pool_views = {
            p: {
                p: PoolView(
                    id=p,
                    slots_per_machine=SLOTS_PER_MACHINE,
                    max_machines=config.machines,
                    warm_target=config.warm_target,
                )
            }
            for p in self.pools
        }
        # Pools whose idle clock runs, with when the pool idle release can first let their
        # warm capacity go (its scan's rows, kept as a schedule like the nets').
        self.pool_idle_due: dict[str, float] = {}
        self.machines: dict[str, Machine] = {}
        self.live: set[str] = set()  # machines not DESTROYED
        self.by_pool: dict[str, set[str]] = {p: set() for p in self.pools}
        # Each pool's machines that bill or are about to (not STOPPED or DESTROYED).
        self.running: Counter[str] = Counter()
        self.jobs: dict[str, Job] = {}
        self.queued: dict[str, dict[str, Job]] = {p: {} for p in self.pools}
        # The same jobs as each pool's workspaces' queues, oldest first (ids are given in
        # order of arrival): what the snapshot's query reads, a workspace's oldest
        # ``queued_read_bound`` waiting jobs, is the head of its list.
        self.ws_queue: dict[str, dict[str, list[Job]]] = {p: {} for p in self.pools}
        self.running_per_ws: Counter[str] = Counter()
        # (workspace, pool) -> slots its live attempts hold: the fairness table's (fairness.py).
        self.held_slots: Counter[tuple[str, str]] = Counter()
        # (workspace, pool) -> its jobs in the pool's queue.
        self.waiting: Counter[tuple[str, str]] = Counter()
        # Pools whose last tick held a film back at the films' share cap.
        self.share_capped: set[str] = set()
        self.quarantined: dict[str, datetime] = {}  # offering -> until
        self.halted: dict[tuple[str, str], datetime] = {}  # (provider, region) -> until
        self.stockouts: dict[str, float] = {}  # zone -> until
        # instance id -> (listing, launched, offering): created at the provider, no record here
        self.orphans: dict[str, tuple[ListedInstance, float, Offering]] = {}
        self.orphan_tracked: dict[tuple[str, str], orphan_sweep.TrackedOrphan] = {}
        self.dirty: set[str] = set()
        self.tick_pending = False
        self.tick_at: float | None = None  # when the pending tick runs (an older event is void)
        self.down_until = 0.0  # the control plane is down (restart) until
        # The control plane's process generation: a restart starts new processes, and an
        # answer to a call an older one made is read by no one (``_call``, ``_started``).
        self.epoch = 0
        # What the new processes find left over by the ones a restart killed, for the first
        # tick's adopt (tick/scale.py's and tick/dispatch.py's ``adopt``): machines whose
        # create or start was under way, and attempts whose StartJob was.
        self.unadopted: set[str] = set()
        self.undispatched: dict[str, Attempt] = {}
        # Each pause of the reaper's leader: (from, when it wakes, whether its lease ran out).
        self.reaper_pause_log: list[tuple[float, float, bool]] = []
        self.reaper_paused_until = 0.0
        self.outages: list[tuple[float, float]] = []
        self.ordinal = 0
        self.attempt_seq = 0
        self.job_seq = 0
        # Each net's schedule of rows that can first match its scan's WHERE clause.
        self.due: dict[str, dict[str, float]] = defaultdict(dict)
        # The same schedules as heaps of (t, machine id), the earliest first, for the next
        # wake and the rows due; an entry the schedule no longer holds is passed over.
        self.due_heap: dict[str, list[tuple[float, str]]] = defaultdict(list)
        # Each net's next pass, pushed only once something can be due then: (its time, a
        # token its event carries; an event whose token is not the net's any more is void).
        self.next_pass: dict[str, tuple[float, int]] = {}
        self.pass_tokens = 0
        self.net_rank: dict[str, int] = {}  # set by run()
        self.idle_watch: set[str] = set()
        self.recon_watch: set[str] = set()
        self.rng_calls = random.Random(f"{config.seed}:calls")
        self.rng_jobs = random.Random(f"{config.seed}:jobs")
        self.rng_env = random.Random(f"{config.seed}:environment")
        self.workspaces = self._workspaces()
        self.plan_of = {ws: plan for ws, plan, _, _ in self.workspaces}
        self.limits = {ws: PLANS[plan].max_gpu_jobs for ws, plan in self.plan_of.items()}
        self.fairness = FairnessLedger({ws: (plan, PLANS[plan].weight) for ws, plan, _, _ in self.workspaces})
        # Cumulative, once: ``choices`` would add up 400 weights at every arrival.
        self.ws_cum_weights = list(accumulate(x[3] for x in self.workspaces))
        self.kind_cum_weights = list(accumulate(k.share for k in self.cfg.workload.kinds))
        # Invariants fail the run for the real nets; a counterfactual policy's harm is counted.
        self.strict = policy == "nets"
        self.violations: list[str] = []
        t = config.timing
        # The services' own settings: the nets' cadences, thresholds and back-offs, and the
        # scheduler's deadlines, read through the net registry's bindings (gpufleet.sim.nets),
        # never restated here.
        self.settings = settings or NetSettings()
        self.scheduler = self.settings.scheduler
        # Fair-share usage, as the scheduler's snapshot reads it (sim/fair_share.py).
        self.usage = WindowUsage(self.scheduler.fair_share_window_s)
        self.order_wake: dict[str, float] = {}  # pool -> its next wake-up (_wake_at)
        # The scheduler's own tick policy, under the simulated fleet's ceiling.
        self.tick_policy = self.scheduler.tick_policy(config.machines)
        # The ledger's outcomes as each service that writes a row builds them from its own
        # settings (a row's quarantine TTLs, a replacement's back-off and disruption budget).
        self.outcomes: dict[Writer, OutcomePolicy] = {
            "scheduler": self.scheduler.outcome_policy(),
            "reaper": self.settings.reaper.outcome_policy(),
            "sweeper": self.settings.sweeper.outcome_policy(),
        }
        # A requeue's back-offs as the scheduler's job writers build them.
        self.retries = self.scheduler.retry_policy()
        reaper = self.settings.reaper
        self.every = self.settings.cadences()
        # The reaper's nets (and the merged check in their place) stop while its leader is
        # paused, until the leader lease it holds runs out (its standby then takes over).
        self.reaper_nets = {n.name for n in net_registry.simulated() if n.service is Service.REAPER} | {
            MERGED_CHECK
        }
        self.reaper_lease_ttl_s = reaper.lease_ttl_s
        # A provider's list lags its creates: the reconcile's grace for a machine never listed.
        self.not_listed_grace = timedelta(seconds=self.settings.sweeper.not_listed_grace_s)
        self.every[MERGED_CHECK] = self.every["went_silent"]
        # The scheduler's pool idle release (a request watchdog of its own, not a net).
        self.pool_idle_every_s = self.scheduler.pool_idle_every_s
        # The scheduler's request watchdogs over waiting jobs (the queue-wait timeout, the
        # paid-wait incident): their cadences, and the jobs each pass is due for.
        self.job_every = {
            QUEUE_WAIT: self.scheduler.queue_wait_every_s,
            PAID_WAIT: self.scheduler.paid_wait_every_s,
        }
        self.paid_wait_policy = self.scheduler.paid_wait_policy()
        # Each one's decision over the waiting jobs its pass reads, and its act on each.
        self.job_watchdogs: dict[
            str, tuple[Callable[[float, list[Job]], list[Job]], Callable[[Job], None]]
        ] = {
            QUEUE_WAIT: (self._queue_wait, self._fail_waiting),
            PAID_WAIT: (self._paid_wait, self._open_paid_wait),
        }
        self.paid_wait_after_s = self.paid_wait_policy.after.total_seconds()
        # Machines the ledger has a not_yet_listed row for (one each, ever).
        self.not_yet_listed_recorded: set[str] = set()
        self.job_due: dict[str, defaultdict[float, list[Job]]] = {
            n: defaultdict(list) for n in self.job_every
        }
        # Where each control-plane loop's passes fall (``Passes``): on its cadence from the
        # month's start, and from its new process's first pass after a restart or a takeover.
        self.loops = {name: Passes(every) for name, every in self.every.items()}
        self.tick_loop = Passes(config.tick_s)
        self.pool_idle_loop = Passes(self.pool_idle_every_s)
        self.job_loops = {name: Passes(every) for name, every in self.job_every.items()}
        # The evaluate-everything mode's one pending pass of each loop that has no token of
        # its own (the pool idle release, the request watchdogs): a restart starts it anew.
        self.chain: Counter[str] = Counter()
        self.idle_policy = reaper.idle_policy()
        self.auto_stop_policy = reaper.auto_stop_policy()
        self.auto_destroy_policy = reaper.auto_destroy_policy()
        self.provision_deadline_policy = reaper.provision_deadline_policy()
        self.boot_policy = reaper.boot_failure_policy()
        self.silent_policy = reaper.went_silent_policy()
        self.lost_policy = reaper.lost_policy()
        self.stuck_policy = reaper.stuck_policy()
        self.orphan_policy = replace(self.settings.sweeper.orphan_policy(), deployment_id=DEPLOYMENT)
        # The thresholds the nets' schedules are kept with, in plain seconds.
        self.stuck_after_s = self.stuck_policy.stuck_after.total_seconds()
        self.boot_window_s = self.boot_policy.window.total_seconds()
        self.silent_after_s = self.silent_policy.silent_after.total_seconds()
        self.lost_after_s = self.lost_policy.lost_after.total_seconds()
        # Passes each net made (a drift test compares them with the registry).
        self.net_passes: Counter[str] = Counter()
        self.heartbeat_s = t.heartbeat_s
        # Each pool's machine and attempt views as the tick reads them, kept between ticks.
        self.lease_s = self.scheduler.attempt_lease_s
        # A StartJobs call (idempotent) to an agent the path does not reach: how long the
        # dispatch waits before it gives up, by the client's own schedule and deadline.
        self.dispatch_unanswered, self.dispatch_unanswered_s = unanswered()
        self.rows = {
            p: PoolRows(self.heartbeat_s, SLOTS_PER_MACHINE, self.lease_s, self.scheduler.worker_fresh_s)
            for p in self.pools
        }

    # -- set-up ------------------------------------------------------------------------

    def _workspaces(self) -> list[tuple[str, str, str, float]]:
        """(id, plan, pool, activity weight): a heavy-tailed activity, a home region."""
        if self.script is not None:
            return [(ws, plan, self.script.offering.pool, 1.0) for ws, plan in self.script.workspaces]
        rng = random.Random(f"{self.cfg.seed}:workspaces")
        w = self.cfg.workload
        out = []
        for i in range(w.workspaces):
            plan = _pick(rng, w.plans)
            pool = _pick(rng, w.regions)
            out.append((f"ws-{i:04d}", plan, pool, rng.paretovariate(w.activity_shape)))
        return out

    def _mean_slot_s(self) -> float:
        total = 0.0
        for k in self.cfg.workload.kinds:
            sigma = math.log(k.p90_s / k.p50_s) / 1.2816
            mean = k.p50_s * math.exp(sigma * sigma / 2)
            slots = SLOTS_PER_MACHINE if KINDS[k.kind_id].slots == 0 else KINDS[k.kind_id].slots
            total += k.share * min(mean, KINDS[k.kind_id].time_limit_s) * slots
        return total

    def run(self, on_progress: Callable[[float], None] | None = None) -> Metrics:
        w = self.cfg.workload
        self.base_rate = w.mean_load * self.cfg.machines * SLOTS_PER_MACHINE / self._mean_slot_s()
        self.bursts = self._bursts()
        self.burst_starts = [a for a, _ in self.bursts]
        if self.script is not None:
            for sj in self.script.jobs:
                self.q.at(sj.at, partial(self._arrive_scripted, sj))
            for at, down_s in self.script.restarts:
                self.q.at(at, partial(self._outage, "restart", down_s))
        else:
            self._next_arrival(0.0)
        # The grid loops' ranks among the events of one instant: the sample, then the nets
        # (the longest cadence first, then the registry's order), then the fleet tick.
        names = self.scheduled_nets()
        by_cadence = sorted(names, key=lambda n: (-self.every[n], names.index(n)))
        self.net_rank = {name: SAMPLE_RANK + 1 + i for i, name in enumerate(by_cadence)}
        for name in names:
            if self.evaluate_everything:
                self._push_pass(name, self.every[name])
        if self.evaluate_everything:
            self._schedule_tick(self.cfg.tick_s)
            self.q.at(self.pool_idle_loop.ceil(0.0), partial(self._pool_idle_pass, 0), POOL_IDLE_RANK)
            for name, loop in self.job_loops.items():
                self.q.at(loop.ceil(0.0), partial(self._job_pass, name, 0), JOB_WATCHDOG_RANK)
        elif any(self._warm(p) for p in self.pools):
            # The first tick finds the pools with warm capacity idle (their clocks start)
            # and short of their warm machines: it runs whatever arrives.
            self.dirty.update(p for p in self.pools if self._warm(p))
            self._schedule_tick(self.cfg.tick_s)
        if self.script is None:
            self._environment()
        self.q.at(3600.0, self._sample, SAMPLE_RANK)
        # The cycle collector is off while the month runs: the world makes next to no
        # cyclic garbage (a 4-day run's collections found 708 objects, the month's oldest
        # generation none), and each full pass walks every live job, attempt and view —
        # about 5 % of a month's wall time.
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.q.run_until(self.end, on_progress)
        finally:
            if collecting:
                gc.enable()
        if not self.evaluate_everything:
            self._count_passes()
        self._close_books()
        return self.metrics

    def scheduled_nets(self) -> list[str]:
        """The nets this policy runs, in the registry's order: every registered net the
        simulator models (the merged policy swapping its composite check in for the nets it
        replaces)."""
        names = [n.name for n in net_registry.simulated()]
        if self.policy == "merged":
            return [n for n in names if n not in MERGED_REPLACES] + [MERGED_CHECK]
        return names

    # -- the workload ----------------------------------------------------------------------

    def _bursts(self) -> list[tuple[float, float]]:
        w = self.cfg.workload
        rng = random.Random(f"{self.cfg.seed}:bursts")
        out: list[tuple[float, float]] = []
        t = 0.0
        while w.bursts_per_day > 0:
            t += rng.expovariate(w.bursts_per_day / 86400.0)
            if t > self.end:
                break
            out.append((t, t + w.burst_s))
        return out

    def _rate(self, t: float) -> float:
        w = self.cfg.workload
        r = self.base_rate * (1 + w.daily_amplitude * math.sin(2 * math.pi * (t / 86400.0 - 0.375)))
        # Every burst lasts as long, so the last one begun by t is the one that may cover it.
        i = bisect_right(self.burst_starts, t) - 1
        if i >= 0 and t < self.bursts[i][1]:
            r *= w.burst_factor
        return r

    def _next_arrival(self, t: float) -> None:
        w = self.cfg.workload
        peak = self.base_rate * (1 + w.daily_amplitude) * w.burst_factor
        rng = self.rng_jobs
        while True:  # thinning: a Poisson process of the peak rate, kept at rate(t) / peak
            t += rng.expovariate(peak)
            if t > self.end:
                return
            if rng.random() * peak <= self._rate(t):
                break
        self.q.at(t, self._arrive)

    def _arrive(self) -> None:
        rng = self.rng_jobs
        now = self.q.now
        ws, plan, pool, _ = rng.choices(self.workspaces, cum_weights=self.ws_cum_weights)[0]
        mix = rng.choices(self.cfg.workload.kinds, cum_weights=self.kind_cum_weights)[0]
        kind = KINDS[mix.kind_id]
        sigma = math.log(mix.p90_s / mix.p50_s) / 1.2816
        duration = min(rng.lognormvariate(math.log(mix.p50_s), sigma), 0.95 * kind.time_limit_s)
        fails = rng.random() < self.cfg.workload.own_failure_share
        self._enqueue(ws, plan, pool, kind.id, duration * (rng.random() if fails else 1.0), fails)
        self._next_arrival(now)

    def _arrive_scripted(self, sj: ScriptedJob) -> None:
        self._enqueue(
            sj.workspace, self.plan_of[sj.workspace], self.offerings[0].pool, sj.kind, sj.run_s, False
        )

    def _enqueue(self, ws: str, plan: str, pool: str, kind_id: str, duration: float, fails: bool) -> None:
        """A job arrives in ``pool``'s queue: it runs ``duration`` once started, and fails on
        its own code at the end if ``fails``."""
        now = self.q.now
        kind = KINDS[kind_id]
        spec = PLANS[plan]
        self.job_seq += 1
        job = Job(
            id=f"j{self.job_seq:07d}",
            workspace=ws,
            plan=plan,
            pool=pool,
            kind=kind.id,
            slots_needed=SLOTS_PER_MACHINE if kind.slots == 0 else kind.slots,
            whole=kind.slots == 0,
            tier=spec.tier,
            weight=spec.weight,
            created=now,
            duration_s=duration,
            fails_own=fails,
            time_limit_s=kind.time_limit_s,
            expected_s=kind.expected_duration_s or kind.time_limit_s,
            queued_since=now,
            created_dt=dt(now),
        )
        self.jobs[job.id] = job
        self._record("job", job.id, JobState.QUEUED)
        self._wait_began(job)
        self.queued[pool][job.id] = job
        self.ws_queue[pool].setdefault(ws, []).append(job)
        self.waiting[(job.workspace, pool)] += 1
        if self.running_per_ws[ws] < self.limits.get(ws, 0):
            # A job of a workspace at its plan's cap is not among those that may run now:
            # the tick has nothing new to decide until the workspace has room (an end).
            self._touch(pool)

    def _record(self, what: str, ident: str, state: str) -> None:
        if self.history is not None:
            self.history.append((self.q.now, what, ident, state))

    # -- the fleet tick ------------------------------------------------------------------

    def _touch(self, pool: str) -> None:
        """Something the tick decides on changed: run it at its next cadence."""
        self.dirty.add(pool)
        if not self.tick_pending:
            self._schedule_tick(self._next_tick_at())

    def _schedule_tick(self, t: float) -> None:
        """The pending tick runs at ``t`` (one at a time: an earlier-scheduled one is void)."""
        self.tick_pending = True
        self.tick_at = t
        self.q.at(t, self._tick, TICK_RANK)

    def _back_from_restart(self) -> None:
        """A restarted scheduler's first tick runs as it comes back, over every pool (its
        leader knows nothing of what changed while it was down), in both modes."""
        if self.q.now < self.down_until:
            return  # a longer restart began meanwhile: its own end does this
        self.dirty.update(self.pools)
        self._schedule_tick(self.q.now)

    def _next_tick_at(self) -> float:
        """The fleet tick that reads what happens now: this instant's, if the instant is on
        the tick's grid and its tick is still to run (it runs after the instant's other
        events), else the next."""
        return self._first_pass(self.tick_loop, self.q.now, TICK_RANK)

    def _first_pass(self, loop: Passes, t: float, rank: int) -> float:
        """The first pass of ``loop`` (its events of rank ``rank``) that reads what happens
        at ``t``, never before now: this instant's, if it is on the loop's grid and still to
        run (its rank is after the running event's), else the next."""
        q = self.q
        at = loop.ceil(max(t, q.now))
        if at == q.now and q.rank >= rank:
            at = loop.after(q.now)  # this instant's pass has run (or is running)
        return at

    def _tick(self) -> None:
        now = self.q.now
        if now != self.tick_at:
            return  # superseded by a tick scheduled later (a restart's end)
        self.tick_pending = False
        self.tick_at = None
        if now < self.down_until:
            self._schedule_tick(self.down_until)
            return
        if self.evaluate_everything:
            self.dirty.update(self.pools)
        pools, self.dirty = sorted(self.dirty), set()
        policy = self.tick_policy
        for pool in pools:
            snapshot = self._snapshot(pool, now)
            self._sample_fairness(pool, now)
            plan = tick_decide.decide(snapshot, policy)
            self.metrics.decisions["fleet_tick"] += 1
            self._apply_plan(pool, plan, now)
            self._wake_on_order_change(pool, now)
            if self.wake_from_plan and (wake := next_wake(snapshot, policy)) is not None:
                self._wake_at(pool, secs(wake))
        if self.undispatched or self.unadopted:
            self._adopt(now)
        if self.evaluate_everything and not self.tick_pending:
            self._schedule_tick(self._next_tick_at())

    def _adopt(self, now: float) -> None:
        """The tick's follow-up steps for what a process a restart killed left under way
        (tick/fleet.py: ``take_back_overdue``, then the scale's and the dispatch's
        ``adopt``): an attempt still STARTING past the dispatch deadline is taken back
        (``overdue`` for a dispatch no process here is making), one within it dispatched
        again (StartJobs is idempotent by attempt id), and a create or start still pending
        on its row is made again (idempotent by machine id at the provider)."""
        deadline = self.scheduler.dispatch_deadline_s
        left, self.undispatched = self.undispatched, {}
        for aid in sorted(left):
            a = left[aid]
            if a.state != AttemptState.STARTING or a.epoch == self.epoch:
                continue  # a heartbeat named it running, or it ended
            if now - a.started > deadline:
                cause = overdue(dt(now), deadline=timedelta(seconds=deadline), in_flight=False, sent_at=None)
                assert cause is not None
                self._dispatch_failed(a, a.end_event, cause)
            else:
                self.metrics.decisions["adopt:dispatch"] += 1
                self._send_start(a, now)
        pending, self.unadopted = self.unadopted, set()
        for mid in sorted(pending):
            m = self.machines[mid]
            call = m.pending_call
            if call == CREATE and m.state == MachineState.PROVISIONING:
                self.metrics.decisions["adopt:create"] += 1
                self._call(m, CREATE, partial(self._created, m))
            elif call == START and m.state == MachineState.STARTING:
                self.metrics.decisions["adopt:start"] += 1
                self._call(m, START, partial(self._started_machine, m))

    def _wake_on_order_change(self, pool: str, now: float) -> None:
        """Fair-share usage moves with the clock alone: look at the pool again when the
        order of its waiting workspaces can next change (fair_share.next_order_change)."""
        weights = {ws: jobs[0].weight for ws, jobs in self.ws_queue[pool].items() if jobs}
        if len(weights) < 2:
            return
        wake = next_order_change(self.usage, weights, now)
        if wake == INF:
            return
        if wake <= now:
            self._touch(pool)  # inside the tick: its next cadence
        else:
            self._wake_at(pool, wake)

    def _wake_at(self, pool: str, wake: float) -> None:
        """Look at ``pool`` again at ``wake`` (one wake-up a pool, the earliest)."""
        if self.order_wake.get(pool, INF) > wake:
            self.order_wake[pool] = wake
            self.q.at(wake, lambda: self._order_woken(pool, wake))

    def _order_woken(self, pool: str, wake: float) -> None:
        if self.order_wake.get(pool) == wake:
            del self.order_wake[pool]
        self._touch(pool)

    def _sample_fairness(self, pool: str, now: float) -> None:
        """Who contends for the pool's slots at this tick, as fairness.py defines it."""
        contenders = []
        for ws, jobs in self.ws_queue[pool].items():
            # What it can use more: its waiting jobs out of their back-off, but no more of
            # them than its plan's cap on jobs at once leaves room for (the oldest first, as
            # the tick takes them). Read only as far as that: a workspace whose arrivals
            # outrun its cap keeps a backlog of thousands, and reading all of it at every
            # tick doubled a month's time.
            room = max(0, self.limits.get(ws, 0) - self.running_per_ws[ws])
            ready, more = 0, 0
            for j in jobs:
                if j.backoff_until <= now:
                    ready += 1
                    if ready > room:
                        break
                    more += j.slots_needed
            if ready:
                held = self.held_slots[(ws, pool)]
                contenders.append((ws, float(held), float(held + more)))
        self.fairness.sample(pool, now, contenders)

    def _usage(self, ws: str, now: float) -> float:
        return self.usage.at(ws, now)

    def _snapshot(self, pool: str, now: float) -> FleetSnapshot:
        nowd = dt(now)
        queued = []
        limits = self.limits
        for ws, jobs in self.ws_queue[pool].items():
            usage = self._usage(ws, now)
            room = tick_decide.queued_read_bound(limits.get(ws, 0))
            for j in jobs:
                if j.backoff_until > now:
                    continue
                jview = j.view
                if jview is None:
                    jview = j.view = JobView(
                        id=j.id,
                        workspace_id=j.workspace,
                        pool_id=j.pool,
                        kind_id=j.kind,
                        slots_needed=j.slots_needed,
                        whole_machine=j.whole,
                        tier=j.tier,
                        weight=j.weight,
                        created_at=j.created_dt or nowd,
                        usage=usage,
                    )
                else:  # the workspace's fair-share usage moves with time: read it anew
                    object.__setattr__(jview, "usage", usage)
                queued.append(jview)
                room -= 1
                if not room:
                    break
        rows = self.rows[pool]
        rows.read(now, nowd)
        return FleetSnapshot(
            now=nowd,
            queued=queued,
            # Read, never written, by the decision: the counter itself, not a copy.
            running_per_workspace=self.running_per_ws,
            workspace_limits=self.limits,
            machines=rows.machines,
            pools=self.pool_views[pool],
            offerings=self.offering_views[pool],
            live_attempts=rows.attempts,
            quarantined_offerings=frozenset(
                o for o, until in self.quarantined.items() if in_force(until, nowd)
            ),
            halted_regions=frozenset(r for r, until in self.halted.items() if in_force(until, nowd)),
            # The fleet's ceiling is read over every pool; the machines of the others hold
            # room from their request until they stop (``holds_room`` of provisioned ones).
            room_held_elsewhere=sum(n for p, n in self.running.items() if p != pool),
        )

    def _apply_plan(self, pool: str, plan: TickPlan, now: float) -> None:
        attempts: dict[str, Attempt] = {}
        if plan.expired_leases or plan.over_limit:
            attempts = {a.id: a for mid in self.by_pool[pool] for a in _live(self.machines[mid])}
        for aid in plan.expired_leases:
            a = attempts.get(aid)
            if a is not None and a.state in LIVE_ATTEMPT_STATES:
                # Why it ran out, as the limits step asks: its agent still answering the
                # probe well after the worker went quiet makes it a disruption.
                av = a.view
                assert av is not None  # the tick just read it
                cause = lease_expiry_cause(
                    av.lease_expires_at,
                    self.lease_s,
                    a.machine.probe_ok_at(now),
                    self.scheduler.worker_fresh_s,
                )
                self._end_attempt(a, cause, Mover.LEASE_EXPIRY)
                self._ledger(limits.LEASE_LEDGER_CLASS, None)
        for aid in plan.over_limit:
            a = attempts.get(aid)
            if a is not None and a.state in LIVE_ATTEMPT_STATES:
                self._end_attempt(a, limits.TIME_LIMIT_END, Mover.LIMITS)
                self._ledger(limits.TIME_LIMIT_LEDGER_CLASS, None)
        if plan.releases or plan.drains:
            ids = {r.machine_id for r in plan.releases} | {d.machine_id for d in plan.drains}
            rows = {mid: _earmark_row(self.machines[mid]) for mid in ids}
            self._earmark(plan_updates(rows, plan.drains, plan.releases))
        if plan.pool_clocks or plan.warm_pins:
            self._apply_pools(plan, now)
        for action in plan.scale:
            if isinstance(action, CreateMachine):
                self._create(self.offering_by_id[action.offering_id], action.for_job)
            elif isinstance(action, StartMachine):
                self._start(self.machines[action.machine_id], action.for_job)
        for asg in plan.assignments:
            self._assign(self.jobs[asg.job_id], self.machines[asg.machine_id], asg.slots, now)
        if plan.film_waits[WAIT_SHARE_CAP]:
            self.share_capped.add(pool)
            if plan.assignments or plan.scale:
                # Work placed or a machine added changes what a film held at the films'
                # share cap may take (a share of the pool's machines, held only while short
                # jobs wait): the next tick decides it again.
                self._touch(pool)
        else:
            self.share_capped.discard(pool)

    def _earmark(self, updates: Iterable[EarmarkUpdate]) -> None:
        """The films' writes, the scheduler's own updates (``earmark_updates``): an earmark
        cleared before the machine moves, one set after."""
        for u in updates:
            m = self.machines[u.read.machine_id]
            if u.earmark is None:
                m.earmarked_for = None
            if u.to is not None:
                self._move(m, u.to.value, lifecycle.Actor.FLEET_TICK)
            m.earmarked_for = u.earmark

    def _apply_pools(self, plan: TickPlan, now: float) -> None:
        """The pools' idle clocks and warm pins, as the tick's pool writes apply them
        (``warm.clock_values``: the same columns)."""
        nowd = dt(now)
        for clock in plan.pool_clocks:
            views = self.pool_views[clock.pool_id]
            views[clock.pool_id] = replace(views[clock.pool_id], **clock_values(clock, nowd))
            due = pool_idle.due_at(self._pool_idle_row(clock.pool_id))
            if due is None:
                self.pool_idle_due.pop(clock.pool_id, None)
            else:
                self._pool_idle_at(clock.pool_id, secs(due))
        for pin in plan.warm_pins:
            self._pin(self.machines[pin.machine_id], pin.held)

    def _pin(self, m: Machine, held: bool) -> None:
        self._segment(m)  # its idle time from here on is (or is no longer) the warm capacity's
        m.warm_held = held

    def _warm(self, pool: str) -> bool:
        return self.pool_views[pool][pool].warm_target > 0

    # -- the pool idle release (the scheduler's watchdog) --------------------------------

    def _pool_idle_at(self, pool: str, t: float) -> None:
        """``pool`` can first be released at ``t``: the first pass of the watchdog's grid
        from then reads it."""
        self.pool_idle_due[pool] = t
        if not self.evaluate_everything:
            self._pool_idle_wake(t)

    def _pool_idle_wake(self, t: float) -> None:
        at = self._first_pass(self.pool_idle_loop, t, POOL_IDLE_RANK)
        self.q.at(at, partial(self._pool_idle_pass, 0), POOL_IDLE_RANK)

    def _pool_idle_pass(self, chain: int) -> None:
        """One pass of the pool idle release: the real decision over the pools its scan
        finds due, each release applied as the watchdog's one transaction (the pool marked
        released, its pins cleared, a ledger row). A pass a restart moved is not one."""
        now, loop = self.q.now, self.pool_idle_loop
        if self.evaluate_everything:
            if chain != self.chain[pool_idle.NAME]:
                return
            self.q.at(loop.after(now), partial(self._pool_idle_pass, chain), POOL_IDLE_RANK)
        elif loop.ceil(now) != now:
            return  # on the grid of a process a restart ended: its pass moved (``_loops_anew``)
        if now < self.down_until:
            if not self.evaluate_everything:
                self._pool_idle_wake(self.down_until)
            return
        due = sorted(p for p, t in self.pool_idle_due.items() if t <= now)
        if not due:
            return
        rows = []
        for pool in due:
            del self.pool_idle_due[pool]
            rows.append(self._pool_idle_row(pool))
        decision = pool_idle.decide(dt(now), rows)
        self.metrics.decisions[pool_idle.NAME] += len(rows)
        for reason, n in decision.refusals.items():
            self.metrics.refusals[f"{pool_idle.NAME}:{reason}"] += n
        for row in decision.release:
            # The watchdog's one transaction: the pool released, its pins cleared.
            views = self.pool_views[row.pool_id]
            for column, value in pool_idle.RELEASED.items():
                if column != "warm_released":
                    raise ValueError(f"the release writes {column}, which the simulator does not keep")
                views[row.pool_id] = replace(views[row.pool_id], warm_released=value)
            for mid in sorted(self.by_pool[row.pool_id]):
                if self.machines[mid].warm_held:
                    self._pin(self.machines[mid], pool_idle.UNPINNED["warm_held"])
            self._ledger(pool_idle.DETECTS, None)
            self._touch(row.pool_id)

    def _pool_idle_row(self, pool: str) -> pool_idle.PoolIdle:
        """The pool's row as the watchdog's scan reads it."""
        view = self.pool_views[pool][pool]
        return pool_idle.PoolIdle(
            pool, view.warm_target, view.idle_since, self.cfg.idle_release_after_s, view.warm_released
        )

    def _assign(self, job: Job, m: Machine, slots: tuple[int, ...], now: float) -> None:
        if job.live is not None:
            self.metrics.jobs_run_twice_at_once += 1
            self._broken(f"job {job.id} given a second live attempt")
        if any(s in m.attempts or s in m.held for s in slots):
            self._broken(f"slot of machine {m.id} given twice")
        self.attempt_seq += 1
        a = Attempt(id=f"a{self.attempt_seq:08d}", job=job, machine=m, slots=slots, started=now)
        a.started_dt = dt(now)
        self.usage.started(job.workspace, now, len(slots))
        for s in slots:
            m.attempts[s] = a
        m.drop_view()  # the slot map changed in place
        m.live_attempts.append(a)
        job.live = a
        self._checked(check_job_move, JobState(job.state), JobState.DISPATCHING, Mover.DISPATCH)
        job.state = JobState.DISPATCHING
        self._record("job", job.id, JobState.DISPATCHING)
        self._dequeue(job)
        self.running_per_ws[job.workspace] += 1
        if job.whole:
            # A film placed: as the assign commit does, every machine held for it is
            # unearmarked, a draining one ready again (earmark_updates.films_started).
            held = (self.machines[mid] for mid in sorted(self.by_pool[job.pool]))
            rows = [_earmark_row(h) for h in held if h.earmarked_for == job.id]
            self._earmark(films_started(rows, {job.id: m.id}))
            self._touch(job.pool)
        if self.running_per_ws[job.workspace] >= self.limits.get(job.workspace, 0):
            # The workspace is at its plan's cap: its jobs waiting anywhere stop waiting to
            # run (a film held back by the films' share cap while they waited may go, an
            # earmark for its film is released).
            for pool in self.pools:
                if self.waiting[(job.workspace, pool)]:
                    self._touch(pool)
        self.held_slots[(job.workspace, job.pool)] += len(slots)
        # The assign commit clears the machine's idle timers.
        self._clear_timers(m)
        self.idle_watch.discard(m.id)
        self._useful(m, now)
        if not m.reporting(now):
            # No report will renew its lease: it runs out the lease after its start.
            self.q.at(_just_after(now + self.lease_s), lambda: self._touch(m.offering.pool))
        self._send_start(a, now)

    def _send_start(self, a: Attempt, now: float) -> None:
        """The StartJobs call for ``a``, made by this process (its dispatch, or its adopt's
        re-dispatch of an attempt a restarted process left STARTING)."""
        m, gen = a.machine, a.end_event
        a.epoch = self.epoch
        if m.agent_reachable(now):
            # The agent answers StartJobs: it hands the attempt to its worker and says so, the
            # worker alive or not (a dead worker never runs it: its lease runs out).
            self.q.after(self.cfg.timing.dispatch_s, lambda: self._started(a, gen))
        else:
            # The path drops the call: no try is answered. The dispatch gives up once the
            # client's whole schedule has run (each try to its deadline, then the pauses) and
            # reads the status it ended with — unless the tick's take-back of overdue
            # dispatches comes first: the first tick at which the call has been out longer
            # than the dispatch deadline (it runs after the tick's plan).
            give_up = now + self.dispatch_unanswered_s
            overdue_at = self.tick_loop.after(now + self.scheduler.dispatch_deadline_s)
            if overdue_at < give_up:
                self.q.at(overdue_at, lambda: self._dispatch_overdue(a, gen), TICK_RANK + 1)
            else:
                self.q.at(give_up, lambda: self._dispatch_failed(a, gen, self.dispatch_unanswered))

    def _dequeue(self, job: Job) -> None:
        """The job leaves its pool's queue (placed, or failed waiting)."""
        if self.queued[job.pool].pop(job.id, None) is not None:
            self.waiting[(job.workspace, job.pool)] -= 1
            queue = self.ws_queue[job.pool]
            jobs = queue[job.workspace]
            del jobs[bisect_left(jobs, job.id, key=_job_id)]
            if not jobs:
                del queue[job.workspace]

    # -- the scheduler's request watchdogs over waiting jobs -----------------------------

    def _wait_began(self, job: Job) -> None:
        """The job's wait began now: the first pass of each request watchdog's grid that can
        act on it — the queue-wait timeout once it is strictly past its kind's deadline, the
        paid-wait incident once it has waited strictly longer than ``paid_wait_after_s``
        (once per job, ever) — is that watchdog's due pass for it."""
        if self.evaluate_everything:
            return  # every pass reads the whole queue
        self._job_due(QUEUE_WAIT, job)
        if not job.paid_wait_opened:
            self._job_due(PAID_WAIT, job)

    def _job_due_at(self, name: str, job: Job) -> float:
        """When the request watchdog ``name`` can first act on ``job``: strictly after this."""
        if name == QUEUE_WAIT:
            return job.queued_since + KINDS[job.kind].queue_wait_deadline_s
        return job.queued_since + self.paid_wait_after_s

    def _job_due(self, name: str, job: Job) -> None:
        self._job_pass_at(name, self.job_loops[name].after(self._job_due_at(name, job)), [job])

    def _job_pass_at(self, name: str, at: float, jobs: Iterable[Job]) -> None:
        if at >= self.end:
            return
        bucket = self.job_due[name][at]
        if not bucket:
            self.q.at(at, partial(self._job_pass, name, 0), JOB_WATCHDOG_RANK)
        bucket.extend(jobs)

    def _job_pass(self, name: str, chain: int = 0) -> None:
        """One pass of a request watchdog over waiting jobs: the real decision over the jobs
        its scan reads, oldest wait first, at most ``MAX_PER_RUN`` acted on (the rest at the
        next pass). Event-driven, a pass reads only the jobs it is due for: every other
        waiting job is one the decision leaves alone, so it decides the same. A pass while
        the scheduler is down runs when it is back."""
        now, loop = self.q.now, self.job_loops[name]
        if self.evaluate_everything:
            if chain != self.chain[name]:
                return
            self.q.at(loop.after(now), partial(self._job_pass, name, chain), JOB_WATCHDOG_RANK)
            waiting = [j for queue in self.queued.values() for j in queue.values()]
        else:
            # (One job twice at a pass: its wait began again within a pass of the last.)
            due = self.job_due[name].pop(now, [])
            waiting = list({j.id: j for j in due if j.state == JobState.QUEUED}.values())
        if now < self.down_until:
            if not self.evaluate_everything:
                self._job_pass_at(name, loop.ceil(self.down_until), waiting)
            return
        waiting.sort(key=lambda j: (j.queued_since, j.id))
        decide, act = self.job_watchdogs[name]
        acts = decide(now, waiting)
        left = acts[watchdog_common.MAX_PER_RUN :]
        for job in acts[: watchdog_common.MAX_PER_RUN]:
            act(job)
        if left and not self.evaluate_everything:
            self._job_pass_at(name, loop.after(now), left)

    def _queue_wait(self, now: float, waiting: list[Job]) -> list[Job]:
        """The jobs ``queue_wait.decide`` fails now."""
        scanned = [
            queue_wait.QueuedJob(j.id, j.kind, dt(j.queued_since), KINDS[j.kind].queue_wait_deadline_s)
            for j in waiting
        ]
        return [self.jobs[e.job.job_id] for e in queue_wait.decide(dt(now), scanned)]

    def _paid_wait(self, now: float, waiting: list[Job]) -> list[Job]:
        """The jobs ``paid_wait.decide`` opens an incident for now."""
        scanned = [
            paid_wait.WaitingJob(
                j.id, j.workspace, j.plan, PLANS[j.plan].rate_micros, dt(j.queued_since), j.paid_wait_opened
            )
            for j in waiting
        ]
        return [self.jobs[w.job_id] for w in paid_wait.decide(dt(now), scanned, self.paid_wait_policy).open]

    def _open_paid_wait(self, job: Job) -> None:
        """The paid-wait incident's transaction: the job's flag and its ledger row (and
        incident), once per job, ever."""
        job.paid_wait_opened = True
        self._ledger(FailureClass.PAID_WAIT, None)

    def _fail_waiting(self, job: Job) -> None:
        """The queue-wait timeout's transaction: QUEUED to FAILED by the request watchdog,
        uncharged (a queued job holds no attempt), its ledger row."""
        self._checked(check_job_move, JobState.QUEUED, JobState.FAILED, Mover.REQUEST_WATCHDOG)
        self._dequeue(job)
        job.state = JobState.FAILED
        self._record("job", job.id, JobState.FAILED)
        self.metrics.queue_wait_timeouts += 1
        self._ledger(FailureClass.QUEUE_WAIT_TIMEOUT, None)
        self._touch(job.pool)  # the tick's queue changed

    def _started(self, a: Attempt, gen: int) -> None:
        """The agent took the attempt and answered the StartJob."""
        if a.state != AttemptState.STARTING or a.end_event != gen:
            return
        self._hand_over(a, gen)
        if a.epoch == self.epoch:
            self._running(a, Mover.DISPATCH)
            return
        # No one reads the answer (the dispatching process died in a restart): the worker's
        # next heartbeat names the attempt, and the worker service (on the replica still up)
        # moves it to running; a worker that does not report leaves it for the adopt.
        m, now = a.machine, self.q.now
        if m.reporting(now):
            sd, hb = m.startup_done_at, self.heartbeat_s
            self.q.at(sd + grid_after(now - sd, hb), partial(self._reported_running, a, gen, m.life))

    def _reported_running(self, a: Attempt, gen: int, life: int) -> None:
        """A heartbeat names an attempt still STARTING (worker_service: it runs)."""
        m = a.machine
        live = a.state == AttemptState.STARTING and a.end_event == gen
        if live and m.life == life and m.reporting(self.q.now):
            self._running(a, Mover.WORKER)

    def _hand_over(self, a: Attempt, gen: int) -> None:
        """The agent hands the attempt to its worker: the job runs from now, once (a
        re-dispatch of one it has is answered, not run again)."""
        if a.handed_over:
            return
        a.handed_over = True
        job = a.job
        ends = JobState.FAILED if job.fails_own else JobState.SUCCEEDED
        self.q.after(job.duration_s, lambda: self._job_done(a, gen, ends))
        # The tick reads the time limit: make it look when it falls due, if the attempt is
        # still live then (most end long before; a tick for them would decide nothing new).
        # Over it means started before now minus the limit: the first tick after the limit.
        self.q.at(_just_after(a.started + job.time_limit_s), lambda: self._limit_due(a, gen))

    def _running(self, a: Attempt, by: Mover) -> None:
        """The attempt and its job move to running: the StartJob's answer read by its
        dispatch, or the worker's heartbeat naming it."""
        now = self.q.now
        self._checked(check_attempt_move, AttemptState.STARTING, AttemptState.RUNNING, by)
        self._checked(check_job_move, JobState(a.job.state), JobState.RUNNING, by)
        a.state = AttemptState.RUNNING
        a.machine.stale.add(a.machine.id)  # its attempt's view changed
        if by is Mover.DISPATCH and a.machine.dispatch_failures:
            # A dispatch its agent took: the back-off starts over (the dispatch's write).
            self._write(a.machine, DISPATCH_TOOK.values())
        job = a.job
        job.state = JobState.RUNNING
        self._record("job", job.id, JobState.RUNNING)
        if job.first_start is None:
            job.first_start = now
            self.metrics.waits[(job.kind, job.plan)].append(now - job.created)

    def _limit_due(self, a: Attempt, gen: int) -> None:
        if a.state in LIVE_ATTEMPT_STATES and a.end_event == gen:
            self._touch(a.job.pool)

    def _dispatch_overdue(self, a: Attempt, gen: int) -> None:
        """The tick's take-back of a dispatch still STARTING past its deadline, with the
        reason ``overdue`` gives for a call this process sent that long ago (a process a
        restart killed sent nothing the new one knows of: its adopt takes such attempts)."""
        if a.state != AttemptState.STARTING or a.end_event != gen or a.epoch != self.epoch:
            return
        deadline = timedelta(seconds=self.scheduler.dispatch_deadline_s)
        cause = overdue(dt(self.q.now), deadline=deadline, in_flight=True, sent_at=a.started_dt)
        if cause is None:
            self._broken(f"attempt {a.id} taken back before its dispatch deadline")
            return
        self._dispatch_failed(a, gen, cause)

    def _dispatch_failed(self, a: Attempt, gen: int, cause: DispatchFailure) -> None:
        """The dispatch gave up on the attempt for ``cause``: its one transaction takes the
        attempt back with its ledger row, and backs the machine off when ``BACKS_OFF`` says
        the failure is the agent's."""
        if a.state != AttemptState.STARTING or a.end_event != gen:
            return
        if cause is not DispatchFailure.NOT_DISPATCHED and a.epoch != self.epoch:
            return  # the call's own give-up, in a process a restart killed
        m = a.machine
        self._end_attempt(a, EndCause.TAKEN_BACK, Mover.DISPATCH)
        self._ledger(FailureClass.JOB_INFRA_ERROR, None)
        if BACKS_OFF[cause]:
            # The dispatch's back-off, its own write (dispatch_failure.backed_off).
            after = backed_off(
                m.dispatch_failures,
                dt(self.q.now),
                self.scheduler.dispatch_backoff_s,
                self.scheduler.dispatch_backoff_max_s,
            )
            self._write(m, after.values())
            assert after.dispatch_backoff_until is not None
            # It may take jobs again from the instant its back-off ends (backing off is "until > now").
            self.q.at(secs(after.dispatch_backoff_until), lambda: self._touch(m.offering.pool))

    def _job_done(self, a: Attempt, gen: int, state: str) -> None:
        if a.state != AttemptState.RUNNING or a.end_event != gen:
            return
        m = a.machine
        if not m.reporting(self.q.now):
            return  # its worker cannot report the end: the lease will say what happened
        # The completion carries the slot-seconds the agent measured: its process's run
        # (launched a dispatch after the assignment), not the time since the assignment.
        ran = a.job.duration_s * len(a.slots)
        cause = EndCause.JOB_FAILED if state == JobState.FAILED else EndCause.SUCCEEDED
        update = self._end_attempt(a, cause, Mover.WORKER, ran)
        if update.ledger_class is not None:  # ReportCompletion's row (the runner's class)
            self._ledger(FailureClass(update.ledger_class), None)

    def _end_attempt(
        self,
        a: Attempt,
        cause: EndCause,
        by: Mover,
        measured_slot_s: float | None = None,
        retries: RetryPolicy | None = None,
    ) -> JobUpdate:
        """End a live attempt as the services do: the job lifecycle's own decision (its
        state, its charge, the job's next state, counters and back-off), each move checked
        against the lifecycle's tables for ``by``, the service that makes it. Its
        slot-seconds are those its worker measured (a completion's), else the time since it
        started, as the job writer records them. ``retries``: the writer's retry policy
        (default: the scheduler's). Returns the decision applied."""
        now = self.q.now
        m, job = a.machine, a.job
        kind = KINDS[job.kind]
        counters = JobCounters(
            JobState(job.state),
            job.failures,
            job.losses,
            kind.retry_budget,
            kind.lost_retry_budget,
            disruptions_used=job.disruptions,
        )
        update = decide_attempt_end(cause, counters, retries or self.retries)
        self._checked(check_cause, cause, by)
        self._checked(check_attempt_move, AttemptState(a.state), update.attempt_state, by)
        if update.job_state is not None:
            self._checked(check_job_move, JobState(job.state), update.job_state, by)
        self.metrics.attempt_ends[cause.value] += 1
        a.state = update.attempt_state.value
        a.end_event += 1
        a.ended = now
        for s in a.slots:
            if m.attempts.get(s) is a:
                del m.attempts[s]
                if update.holds_slot:
                    m.held[s] = a
        m.drop_view()  # the slot map changed in place
        if update.holds_slot:
            self._held_until_reported(m)
        if a in m.live_attempts:
            m.live_attempts.remove(a)
        job.live = None
        self.running_per_ws[job.workspace] -= 1
        self.held_slots[(job.workspace, job.pool)] -= len(a.slots)
        slot_s = self.usage.ended(job.workspace, a.started, now, len(a.slots), measured_slot_s)
        if update.charged:
            a.charged_micros = charge_micros(
                slot_s, m.offering.hourly_price_micros, SLOTS_PER_MACHINE, PLANS[job.plan].rate_micros
            )
            self.metrics.charged_micros[job.plan] += a.charged_micros
        job.failures, job.losses = update.failure_retries_used, update.lost_retries_used
        job.disruptions = update.disruptions_used
        if update.job_state is JobState.QUEUED:
            self._requeue(job, now + (update.backoff_s or 0.0))
        elif update.job_state is not None:
            job.state = update.job_state.value
            self._record("job", job.id, job.state)
            job.failed_our_side = update.job_state is JobState.FAILED and cause in OUR_FAILURES
        if not m.attempts:
            self._idle(m, now)
            self._watch("idle_scanner", self.idle_watch, m.id)
        # What an end changes for the tick: a free slot, which matters to work waiting in
        # the machine's pool, and one fewer job of the workspace at once, which matters to
        # its jobs waiting on its plan's cap in any pool. With neither there is nothing new
        # to decide (time-driven rules have their own events).
        pool = m.offering.pool
        if self._may_place(pool) or self._warm(pool):
            # (A pool with warm capacity: its last attempt's end starts its idle clock.)
            self._touch(pool)
        for other in self.pools:
            if other != pool and self.waiting[(job.workspace, other)] > 0:
                self._touch(other)
        return update

    def _held_until_reported(self, m: Machine) -> None:
        """Slots the control plane ended an attempt on stay held until the machine's worker
        reports the process gone (``EndRule.holds_slot``): told to stop at once (the
        cancel), it is gone by the worker's next heartbeat, which no longer lists it and so
        frees them (the heartbeat's write). A worker that does not report frees them when it
        next does: a new life's first report."""
        now = self.q.now
        if m.reporting(now):
            sd, hb = m.startup_done_at, self.heartbeat_s
            self.q.at(sd + grid_after(now - sd, hb), partial(self._heartbeat_frees, m, m.life))

    def _heartbeat_frees(self, m: Machine, life: int) -> None:
        """A heartbeat of the worker: the processes ended before it are gone, their slots free."""
        now = self.q.now
        if m.life != life or not m.reporting(now):
            return
        self._free_held(m, now)

    def _free_held(self, m: Machine, before: float) -> None:
        gone = [s for s, a in m.held.items() if a.ended < before]
        if not gone:
            return
        for s in gone:
            del m.held[s]
        m.drop_view()  # the slot map changed in place
        pool = m.offering.pool
        if self._may_place(pool) or self._warm(pool):
            self._touch(pool)

    def _may_place(self, pool: str) -> bool:
        """Whether a job in ``pool``'s queue is among those the tick may run now: out of
        its back-off, of a workspace under its plan's cap (``eligible_demand``'s cut)."""
        now, running, limits = self.q.now, self.running_per_ws, self.limits
        for ws, jobs in self.ws_queue[pool].items():
            if running[ws] < limits.get(ws, 0) and any(j.backoff_until <= now for j in jobs):
                return True
        return False

    def _requeue(self, job: Job, not_before: float) -> None:
        job.state = JobState.QUEUED
        self._record("job", job.id, JobState.QUEUED)
        job.backoff_until = not_before
        job.queued_since = self.q.now
        self._wait_began(job)
        if job.id not in self.queued[job.pool]:
            self.waiting[(job.workspace, job.pool)] += 1
            insort(self.ws_queue[job.pool].setdefault(job.workspace, []), job, key=_job_id)
        self.queued[job.pool][job.id] = job
        if not_before > self.q.now:
            self.q.at(not_before, lambda: self._touch(job.pool))

    # -- machines: the lifecycle, billing ----------------------------------------------

    def _segment(self, m: Machine) -> None:
        """Close the machine's current stretch of time, filing idle billed time under
        why it was idle (what the row and the truth said during the stretch)."""
        now = self.q.now
        start, m.seg_from = m.seg_from, now
        if m.bill_from is None or m.useful_from is not None or now <= start:
            return
        waiting = next(
            (f.cls for f in m.life_failures if f.cls in USELESS_CLASSES and f.caught_at is None), None
        )
        if waiting is not None:
            why = f"{waiting} (until caught)"
        elif m.state in (MachineState.STOPPING, MachineState.DESTROYING):
            why = "stop/destroy not yet done"
        elif m.state in (MachineState.PROVISIONING, MachineState.STARTING, MachineState.BOOTING):
            why = "booting"
        elif m.state == MachineState.DRAINING:
            why = "draining for a film"
        elif m.warm_held:
            why = "warm capacity (pinned)"
        elif m.lost or m.reachable_since > now:
            why = "unreachable"
        else:
            why = "quiet (money chain)"
        self.metrics.idle_by_cause[why] += now - start

    def _move(self, m: Machine, to: str, by: lifecycle.Actor) -> None:
        self._segment(m)
        was_running = m.state in RUNNING_STATES
        if m.state in RUNNING_STATES and to not in RUNNING_STATES:
            for f in m.life_failures:
                if f.cls == "path_drop" and f.caught_at is None:
                    # It stops running before the path was judged: nothing is routed to it now.
                    self._caught(f, "machine left")
        if not lifecycle.allowed(MachineState(m.state), MachineState(to), by):
            self._broken(f"{by.value} moved machine {m.id} {m.state} -> {to}, which the lifecycle forbids")
        frees = (m.state in lifecycle.BILLING_STATES) - (to in lifecycle.BILLING_STATES)
        self.running[m.offering.pool] -= frees
        if frees > 0:
            # A machine stops filling the fleet's ceiling: every pool's ceiling is read from it.
            for pool in self.pools:
                if self._may_place(pool):
                    self._touch(pool)
        m.state = to
        m.state_changed_at = dt(self.q.now)
        m.done_unanswered = False  # (a call it stood for is over, whoever ended it)
        self._record("machine", m.id, to)
        if to in TRANSITIONAL_STATES:
            self._due_stuck(m)
        elif to in RUNNING_STATES and not was_running:
            # Its path may have dropped before the row said it ran (a create whose answer
            # came late): the lost detector judges it from now, as its scan would.
            self._due_by("lost_detector", lost_detector.due_at, self.lost_policy, m, self.q.now)
        elif to == MachineState.STOPPED:
            # Its destroy timer, or with none its stop plus the chain's gap (the net's due_at).
            self._due_as(auto_destroy.SPEC, self.auto_destroy_policy, m, self.q.now)
        if to == MachineState.DESTROYED:
            self.live.discard(m.id)
            self.by_pool[m.offering.pool].discard(m.id)
            self.rows[m.offering.pool].remove(m)
            for net in self.due:
                self.due[net].pop(m.id, None)
        if m.earmarked_for is not None or self._may_place(m.offering.pool) or self._warm(m.offering.pool):
            # With no job in the pool that may run now a machine's state changes nothing
            # the tick would do (no job to place or scale for; an earmark is released at
            # the tick that finds its film no longer waiting).
            self._touch(m.offering.pool)

    def _due(self, net: str, m: Machine, t: float) -> None:
        """``m`` can first match ``net``'s scan at ``t`` (the earliest wins)."""
        cur = self.due[net].get(m.id)
        if cur is None or t < cur:
            self.due[net][m.id] = t
            if net in self.net_rank:  # a net this policy runs
                heapq.heappush(self.due_heap[net], (t, m.id))
                self._wake(net, t)

    def _write(self, m: Machine, values: Mapping[str, Any]) -> None:
        """The columns a service's own update writes (``answered_values``, ``finish_values``),
        on the simulator's machine: those it keeps are set, those it derives from its truth
        or does not model are left (``_NOT_KEPT`` says which and why)."""
        for column, value in values.items():
            if column in _AS_IS:
                setattr(m, column, value)
            elif column == "first_observed_at":
                m.recorded_first_observed = secs(value) if value is not None else INF
            elif column == "preemption_count":
                m.preemptions = value
            elif column in ("stop_due_at", "destroy_due_at"):
                if value is None:
                    self._clear(m, (column,))
                else:  # armed: its net wakes when it falls due
                    setattr(m, column, value)
                    if column == "stop_due_at":
                        self._due_as(auto_stop.SPEC, self.auto_stop_policy, m, self.q.now)
                    else:
                        self._due_as(auto_destroy.SPEC, self.auto_destroy_policy, m, self.q.now)
            elif column not in _NOT_KEPT:
                raise ValueError(f"an update writes {column}, which the simulator does not keep")

    def _due_as(self, spec: OneStepSpec[P, A], policy: P, m: Machine, now: float) -> None:
        """Wake ``spec``'s net for ``m`` when the net's own ``due_at`` says it falls due
        (its requeue-after, nothing changing), if it ever does."""
        self._due_by(spec.name, spec.due_at, policy, m, now)

    def _due_by(
        self,
        net: str,
        due_at: Callable[[MachineSnapshot, P], datetime | None],
        policy: P,
        m: Machine,
        read_at: float,
    ) -> None:
        """Wake ``net`` for ``m`` when its own ``due_at`` over the row as it reads at
        ``read_at`` says (a channel's writer may write the row a little after what it
        reports happened: the row is read at that write), if it ever does."""
        at = due_at(self.snapshot(m, read_at), policy)
        if at is not None:
            self._due(net, m, secs(at))

    def _read_again(self, net: str, m: Machine, due_at: datetime | None, now: float) -> None:
        """A row ``net`` read and did not act on is read again as its scan would: at the
        net's next pass while its own ``due_at`` still selects it (None: not until an event
        changes the row)."""
        if due_at is not None:
            self._due(net, m, max(self._next_pass_of(now), secs(due_at)))

    @staticmethod
    def _next_pass_of(now: float) -> float:
        """A row a net reads again is due at its pass after this one, wherever that falls
        (a restart before it moves the grid): due from just after now."""
        return math.nextafter(now, INF)

    def _due_stuck(self, m: Machine) -> None:
        """The stuck-transition net reads ``m`` when its own ``due_at`` says (a transition
        ``stuck_after`` old), if ``m`` is in one."""
        at = stuck_transition.due_at(self.snapshot(m, self.q.now), self.stuck_policy)
        if at is not None:
            self._due("stuck_transition", m, secs(at))

    def _clear(self, m: Machine, timers: Iterable[str]) -> None:
        """Clear the idle timers named (by their columns' names, as a claim lists them)."""
        for name in timers:
            if name == "stop_due_at":
                m.stop_due_at = None
                self.due["auto_stop"].pop(m.id, None)
            elif name == "destroy_due_at":
                m.destroy_due_at = None
                self.due["auto_destroy"].pop(m.id, None)
                if m.state == MachineState.STOPPED:  # due again as a stopped machine with no timer
                    self._due_as(auto_destroy.SPEC, self.auto_destroy_policy, m, self.q.now)
            else:
                raise ValueError(f"a claim clears {name}, which the simulator does not keep")

    def _clear_timers(self, m: Machine) -> None:
        self._write(m, idle_timers.CLEARED)

    def _bill(self, m: Machine, now: float) -> None:
        self._segment(m)
        if m.bill_from is not None:
            span = now - m.bill_from
            self.metrics.billed_s += span
            self.metrics.cost_micros += span * m.offering.hourly_price_micros / 3600.0
            m.bill_from = None
        self._idle(m, now)

    def _useful(self, m: Machine, now: float) -> None:
        self._segment(m)
        if m.useful_from is None and m.bill_from is not None:
            m.useful_from = now

    def _idle(self, m: Machine, now: float) -> None:
        self._segment(m)
        if m.useful_from is not None:
            self.metrics.useful_s += now - m.useful_from
            m.useful_from = None

    def _new_life(self, m: Machine, boot_at: float) -> None:
        """The instance runs from ``boot_at``: draw this life's truth (the n-th machine's
        n-th life draws the same numbers under every policy)."""
        m.life += 1
        rng = random.Random(f"{self.cfg.seed}:machine:{m.ordinal}:{m.life}")
        t, f = self.cfg.timing, self.cfg.faults
        if m.startup_done_at < INF:
            m.earlier_report_at = m.worker_report_at(boot_at, self.heartbeat_s)
        m.earlier_probe_ok_at = m.probe_ok_at(boot_at) or m.earlier_probe_ok_at
        m.life_failures = []
        m.recorded_first_observed = INF
        m.inst_status = "RUNNING"
        m.run_since = boot_at
        m.bill_from = boot_at
        m.seg_from = boot_at
        m.worker_stopped_at = INF
        m.gpu_stuck_busy = False
        m.startup_done_at = INF
        m.reachable_since = INF
        m.unreachable_since = INF
        if self.script is not None:
            self._scripted_life(m, boot_at)
            return
        m.skew_s = rng.uniform(-600, 600) if rng.random() < f.clock_skew_share else 0.0
        if m.skew_s:
            self._inject(m, "clock_skew", boot_at)
        first_life = m.life == 1
        if first_life and rng.random() < f.provision_stall:
            self._inject(m, "provision_stall", boot_at)
            return
        agent_up = boot_at + _lognorm(rng, t.agent_up_p50_s, t.agent_up_p99_s, 2.326, 15 * 60.0)
        self.q.at(agent_up, lambda: self._reach(m, m.life, True))
        if rng.random() < f.boot_never_completes:
            self._inject(m, "boot_never_completes", boot_at)
        else:
            # A healthy boot ends within startup_max_s of the instance starting: the boot
            # window (30 min from first observed) is sized for the slowest healthy boot.
            done = min(
                agent_up + _lognorm(rng, t.startup_p50_s, t.startup_p99_s, 2.326, t.startup_max_s),
                boot_at + t.startup_max_s,
            )
            life = m.life
            self.q.at(done, lambda: self._first_report(m, life))
        # This life's later failures, each at an exponential time from the boot.
        for cls, per_day in (
            ("worker_dies", f.worker_dies_per_day),
            ("worker_wedges", f.worker_wedges_per_day),
            ("path_drop", f.path_drops_per_day),
        ):
            if per_day <= 0:
                continue  # (a profile without this class draws nothing for it)
            at = agent_up + rng.expovariate(per_day / 86400.0)
            heal = rng.uniform(*f.path_heal_s)
            life = m.life
            self.q.at(at, partial(self._fail_later, m, m.life, cls, heal))
        if m.offering.preempt_rate_s:
            at = boot_at + rng.expovariate(m.offering.preempt_rate_s)
            life = m.life
            self.q.at(at, partial(self._preempt, m, m.life))

    def _scripted_life(self, m: Machine, boot_at: float) -> None:
        """A scripted world's life: every boot alike, and only the script's failures."""
        assert self.script is not None
        life = m.life
        first = life == 1
        if first and m.ordinal in self.script.stalls:
            self._inject(m, "provision_stall", boot_at)
            return
        agent_up = boot_at + self.script.agent_up_s
        done = agent_up + self.script.startup_s
        self.q.at(agent_up, lambda: self._reach(m, life, True))
        if first and m.ordinal in self.script.boot_hangs:
            self._inject(m, "boot_never_completes", boot_at)
            return
        self.q.at(done, lambda: self._first_report(m, life))
        if not first:
            return
        for cls, failures in (
            ("worker_dies", self.script.worker_deaths),
            ("worker_wedges", self.script.worker_wedges),
        ):
            for ordinal, after_s in failures:
                if ordinal == m.ordinal:
                    self.q.at(done + after_s, partial(self._fail_later, m, life, cls, 0.0))
        for ordinal, after_s, heal_s in self.script.path_drops:
            if ordinal == m.ordinal:
                self.q.at(done + after_s, partial(self._fail_later, m, life, "path_drop", heal_s))
        for ordinal, after_s in self.script.preemptions:
            if ordinal == m.ordinal:
                self.q.at(done + after_s, partial(self._preempt, m, life))

    def _alive(self, m: Machine, life: int) -> bool:
        return m.life == life and m.inst_status == "RUNNING" and m.state != MachineState.DESTROYED

    def _reach(self, m: Machine, life: int, up: bool) -> None:
        if not self._alive(m, life):
            return
        now = self.q.now
        if up:
            m.reachable_since = now
            m.unreachable_since = INF
            if m.lost:
                # The idle scanner's next probe writes the channel the mark is lifted on.
                self._due("lost_detector", m, m.probes.ceil(now))
            self._watch("idle_scanner", self.idle_watch, m.id)
        else:
            m.earlier_probe_ok_at = m.probe_ok_at(now)
            m.reachable_since = INF
            m.unreachable_since = now
            # Its next probe writes the failure: from then the detector's own clock runs.
            failed_at = m.probes.ceil(now)
            self._due_by("lost_detector", lost_detector.due_at, self.lost_policy, m, failed_at)

    def _first_report(self, m: Machine, life: int) -> None:
        if not self._alive(m, life):
            return
        m.startup_done_at = self.q.now
        # Its first heartbeat lists nothing an earlier life ran: those slots are free.
        self._free_held(m, INF)
        if m.state == MachineState.BOOTING:
            self._move(m, MachineState.READY, lifecycle.Actor.WORKER)
        self._watch("idle_scanner", self.idle_watch, m.id)
        self._touch(m.offering.pool)

    def _fail_later(self, m: Machine, life: int, cls: str, heal: float) -> None:
        if not self._alive(m, life) or m.startup_done_at > self.q.now or m.worker_stopped_at < INF:
            return
        if m.intent != MachineIntent.RUNNING:
            return  # already being stopped or destroyed: what fails now is moot
        now = self.q.now
        if cls == "path_drop":
            if m.reachable_since > now:
                return
            f = self._inject(m, cls, now)
            self._reach(m, life, False)
            self.q.after(heal, lambda: self._heal(m, life, f))
            if self.policy == "oracle":
                self._oracle_lost(m, f, True)
            return
        m.worker_stopped_at = now
        m.gpu_stuck_busy = cls == "worker_wedges"
        f = self._inject(m, cls, now)
        # Went silent waits out its grace after the machine was first seen this life.
        f.held_s = max(0.0, m.first_observed(now) + self.silent_policy.grace.total_seconds() - now)
        report = m.worker_report_at(now, self.heartbeat_s)
        assert report is not None
        self._due_as(went_silent.SPEC, self.silent_policy, m, now)
        self._due(MERGED_CHECK, m, now + self.cfg.merged_threshold_s)
        # The tick sees a stale worker once its last report is more than worker_fresh_s old,
        # and its attempts' leases run out once more than the lease has passed since it.
        last = secs(report)
        self.q.at(_just_after(last + self.scheduler.worker_fresh_s), lambda: self._touch(m.offering.pool))
        self.q.at(_just_after(last + self.lease_s), lambda: self._touch(m.offering.pool))
        self._watch("idle_scanner", self.idle_watch, m.id)
        if self.policy == "oracle":
            self._oracle_destroy(m)

    def _heal(self, m: Machine, life: int, f: Failure) -> None:
        if not self._alive(m, life):
            return
        flap_s = self.every["idle_scanner"] + self.lost_after_s + self.every["lost_detector"]
        if f.caught_at is None and self.q.now - f.at <= flap_s:
            # Back within the lost detector's threshold and cadence: a flap, rightly unmarked.
            self._caught(f, "healed before its threshold")
        self._reach(m, life, True)
        if self.policy == "oracle":
            self._oracle_lost(m, f, False)

    # -- provider calls ----------------------------------------------------------------

    def _call(self, m: Machine, op: str, on_done: Callable[[str], None], by: Caller = "scheduler") -> None:
        """A provider call: the intent is already on the row; the answer comes after the
        call's latency: ``ok``, ``refused`` (nothing done), ``lost`` (done, answer lost),
        or a definitive refusal class for a create or start."""
        self.metrics.provider_calls += 1
        want = _INTENT_OF_CALL[op]
        if m.intent != want:
            self.metrics.calls_without_intent += 1
            self._broken(f"{op} of machine {m.id} called without its intent recorded")
        latency, outcome = self._answer(op, m.offering.zone, exists=m.done_unanswered)
        epoch, made = self.epoch, self.q.now

        def answered() -> None:
            # Who reads the answer: the process that made the call, unless a restart killed
            # it; a reaper leader paused meanwhile reads it when it wakes, or, deposed by
            # then, writes nothing (its writes are fenced). ``by``: the caller ("oracle" and
            # "human" stand outside the control plane's processes).
            if by in ("oracle", "human"):
                on_done(outcome)
            elif self.epoch != epoch:
                self._unanswered(m, op, outcome)
            elif by == "reaper" and (held := self._reaper_held(made)) is not None:
                if held == INF:
                    self._unanswered(m, op, outcome)
                else:
                    self.q.at(held, answered)
            else:
                on_done(outcome)

        self.q.after(latency, answered)

    def _reaper_held(self, made: float) -> float | None:
        """What a pause of the reaper's leader since ``made`` does to an answer arriving
        now: INF if the leader lost its lease in it (the answer is never written), the time
        it wakes if it is still paused, None if nothing."""
        now = self.q.now
        for start, wake, deposed in self.reaper_pause_log:
            if made < start <= now:
                if deposed:
                    return INF
                if wake > now:
                    return wake
        return None

    def _unanswered(self, m: Machine, op: str, outcome: str) -> None:
        """The process that made the call died in a restart before its answer came (or, a
        reaper leader, lost its lease while paused: its writes are fenced): the provider did
        what was asked unless it refused, and no one writes the answer. A create
        or start stays pending on its row, for the new leader's adopt to make again (the
        provider's create and start are idempotent by the machine's id); a stop or destroy
        stays transitional, for the stuck-transition net — as a done call whose answer was
        lost does, with no ledger row (no one saw the call fail)."""
        now = self.q.now
        if op in (CREATE, START):
            want = MachineState.PROVISIONING if op == CREATE else MachineState.STARTING
            if m.intent != MachineIntent.RUNNING or m.state != want:
                return
            self.unadopted.add(m.id)
            if outcome in ("ok", "lost") and not m.done_unanswered:
                if op == CREATE:
                    m.provider_instance_id = m.instance_id
                self._new_life(m, now)
                m.done_unanswered = True
            return
        if m.state not in (MachineState.STOPPING, MachineState.DESTROYING):
            return
        if outcome == "refused":
            f = self._inject(m, "call_failed", now)
        else:
            self._provider_does_unless_done(m, op)
            f = self._inject(m, "answer_lost", now)
        if self.policy == "oracle":
            self._oracle_finish(m, f)

    def _answer(self, op: str, zone: str, exists: bool = False) -> tuple[float, str]:
        """How long a provider call takes and what it answers (``_call``'s outcomes). A
        create or start the provider has already done (``exists``: made again by the adopt)
        answers with what it did — only the call itself can still fail."""
        if self.script is not None:  # every call answered, after the script's latency
            return self.script.call_s, "ok"
        rng, f = self.rng_calls, self.cfg.faults
        latency = rng.uniform(*self.cfg.timing.call_s)
        outcome = "ok"
        if op in ("create", "start") and not exists:
            zone_out = self.stockouts.get(zone, 0.0) > self.q.now
            r = rng.random()
            if zone_out:
                outcome = "stockout"
            elif op == "create" and r < f.quota_error:
                outcome = "quota"
            elif op == "create" and r < f.quota_error + f.auth_error:
                outcome = "auth"
        if outcome == "ok":
            r = rng.random()
            if r < f.call_fails:
                outcome = "refused"
            elif r < f.call_fails + (f.call_times_out if op in ("create", "start") else f.answer_lost):
                outcome = "lost"
        return latency, outcome

    def _create(self, o: Offering, for_job: str | None) -> None:
        now = self.q.now
        self.ordinal += 1
        rows_stale = self.rows[o.pool].stale
        m = Machine(
            id=f"m{self.ordinal:06d}",
            offering=o,
            ordinal=self.ordinal,
            stale=rows_stale,
            probes=self.loops["idle_scanner"],
            listings=self.loops["inventory_reconcile"],
        )
        # The create's intent, as the scale step records it.
        self._write(m, create_values(for_job, dt(now), self.scheduler.provision_deadline_s))
        self.machines[m.id] = m
        self._record("machine", m.id, m.state)
        self.live.add(m.id)
        self.by_pool[o.pool].add(m.id)
        self.running[o.pool] += 1
        self.rows[o.pool].add(m)
        self._due_stuck(m)
        self._due_as(provision_deadline.SPEC, self.provision_deadline_policy, m, now)
        self._call(m, "create", lambda outcome: self._created(m, outcome))

    def _created(self, m: Machine, outcome: str) -> None:
        now = self.q.now
        if m.intent != MachineIntent.RUNNING or m.state != MachineState.PROVISIONING:
            return  # destroyed meanwhile: the destroy (by machine id) removed what the create made
        if outcome in ("ok", "lost"):
            if not m.done_unanswered:  # (made again by the adopt: the instance runs already)
                m.provider_instance_id = m.instance_id
                self._new_life(m, now)
            if self.policy == "oracle" and outcome == "lost":
                self._oracle_finish(m, self._inject(m, "call_timed_out", now))
                return
            if outcome == "ok":
                if m.state == MachineState.PROVISIONING:
                    self._write(m, answered_values(CREATE, dt(now), m.instance_id, ""))
                    self._move(m, MachineState.BOOTING, lifecycle.Actor.FLEET_TICK)
                    self._watch_boot(m, now)
            else:  # done, but the scheduler saw its call fail
                self._inject(m, "call_timed_out", now)
                self._call_failed(m, "create", outcome)
            return
        self._provider_refused(m, "create", outcome)

    def _watch_boot(self, m: Machine, now: float) -> None:
        if m.startup_done_at <= now and m.worker_stopped_at > now:
            # The worker was already reporting while the row caught up (a lost create answer).
            self.q.after(self.heartbeat_s, partial(self._first_report, m, m.life))
        # The boot window counts from first observed, which can precede this move (a create
        # whose answer was lost is observed by the listing before the row catches up) or
        # follow it (a transition finished before any channel saw the instance): the row is
        # read as it will be once first observed. A boot window of an earlier life is over.
        self.due["boot_failure"].pop(m.id, None)
        observed = m.first_observed(INF)  # INF: no channel will see this life as it stands
        read_at = max(now, observed) if observed < INF else now
        self._due_by("boot_failure", boot_failure.due_at, self.boot_policy, m, read_at)
        since = m.run_since if m.run_since < INF else now
        self._due(MERGED_CHECK, m, since + self.cfg.merged_threshold_s)

    def _provider_refused(self, m: Machine, op: Op, outcome: str) -> None:
        """A create or start that failed: nothing was done (``refused``) or the provider
        said no outright (a stockout, a quota, credentials)."""
        now = self.q.now
        if outcome == "refused":
            f = self._inject(m, "call_failed", now)
            if self.policy == "oracle":
                self._oracle_finish(m, f)
                return
        else:
            f = self._inject(m, _REFUSAL_FAILURE[outcome], now)
            self._caught(f, "fleet_tick.scale")
        self._call_failed(m, op, outcome)

    def _call_failed(self, m: Machine, op: Op, outcome: str) -> None:
        """The scale step's answer to a failed create or start, as the scheduler writes it
        (tick/scale.py's ``_refused``): its ledger row, and the row's update from the shared
        decision (gpufleet.common.call_failures) — a start's back-off whatever the failure,
        the row ended when the provider refused outright, else left transitional for the
        stuck-transition net."""
        now = self.q.now
        exc = _ANSWER_ERROR[outcome](f"the simulated provider's {op}: {outcome}")
        fc = refusal_class(exc)
        failed = decide_call_failure(
            op, fc.value, is_definitive(exc), m.start_failures, self.scheduler.start_backoff_s
        )
        values = failed.values(dt(now))
        self._write(m, values)
        self._ledger(fc, m)
        if failed.end_state is not None:
            self._move(m, failed.end_state.value, lifecycle.Actor.FLEET_TICK)
        if "backoff_until" in values:
            self.q.at(secs(values["backoff_until"]), lambda: self._touch(m.offering.pool))
        self._touch(m.offering.pool)  # the scale step reads the row it wrote

    def _ledger(self, fc: FailureClass, m: Machine | None, by: Writer = "scheduler") -> None:
        """A ledger row written by the service ``by``. With ``m`` its outcome takes effect
        (``record_failure(..., apply=True)``): the ledger's own routing table decides what a
        detection leads to, and its own decision (``decide_effect``) what that outcome does,
        under the writing service's ``OutcomePolicy``; applied here as ``apply_outcome``
        applies it in SQL — a quarantine already in force is kept, not extended. Without
        ``m``, the row alone."""
        outcome = route(fc)
        self.metrics.decisions[f"ledger:{fc.value}"] += 1
        now = self.q.now
        if m is None:
            return
        m.ledger_rows.setdefault(fc.value, []).append(dt(now))
        o = m.offering
        policy = self.outcomes[by]
        effect = decide_effect(
            fc.value, outcome, policy, OutcomeTarget(o.id, o.provider, o.region), on_machine=True
        )
        q = effect.quarantine
        if q is not None:
            # Until a human clears it (no TTL): the profile's human response time.
            ttl_s = q.ttl.total_seconds() if q.ttl is not None else self.cfg.faults.human_response_s
            # One in force is kept as it is (ledger.in_force), never extended.
            nowd, region = dt(now), (o.provider, o.region)
            if q.kind is QuarantineKind.OFFERING and not (
                o.id in self.quarantined and in_force(self.quarantined[o.id], nowd)
            ):
                until = self.quarantined[o.id] = dt(now + ttl_s)
                self.q.at(secs(until), lambda: self._touch(o.pool))
            elif q.kind is QuarantineKind.PROVIDER_REGION and not (
                region in self.halted and in_force(self.halted[region], nowd)
            ):
                until = self.halted[region] = dt(now + ttl_s)
                for pool in self.pools:
                    self.q.at(secs(until), partial(self._touch, pool))
        if effect.replace_machine:
            # The replacement's requeues and mover, as ``end_live_attempts_lost`` ends them
            # under the writing service's outcome policy.
            cause = replace_cause(fc)
            retries, mover = replacement(cause, policy.lost_retry_backoff_s, policy.disruption_budget)
            for a in _live(m):
                self._end_attempt(a, cause, mover, retries=retries)

    def _start(self, m: Machine, for_job: str | None) -> None:
        self._write(m, start_values(for_job, dt(self.q.now)))  # the start's intent
        self._move(m, MachineState.STARTING, lifecycle.Actor.FLEET_TICK)
        self._call(m, "start", lambda outcome: self._started_machine(m, outcome))

    def _started_machine(self, m: Machine, outcome: str) -> None:
        now = self.q.now
        if m.intent != MachineIntent.RUNNING or m.state != MachineState.STARTING:
            return
        if outcome in ("ok", "lost"):
            if not m.done_unanswered:  # (made again by the adopt: the instance runs already)
                self._new_life(m, now)
            if outcome == "ok":
                if m.state == MachineState.STARTING:
                    self._write(m, answered_values(START, dt(now), m.provider_instance_id or "", ""))
                    self._move(m, MachineState.BOOTING, lifecycle.Actor.FLEET_TICK)
                    self._watch_boot(m, now)
            else:  # done, but the scheduler saw its call fail
                f = self._inject(m, "call_timed_out", now)
                if self.policy == "oracle":
                    self._oracle_finish(m, f)
                else:
                    self._call_failed(m, "start", outcome)
            return
        self._provider_refused(m, "start", outcome)

    def _stop_or_destroy(
        self,
        m: Machine,
        transition: Transition,
        fc: FailureClass | None,
        claim: Claim | None = None,
    ) -> None:
        """The refusal ladder has passed: the transition's intent and transitional state
        first, then its call (the reaper's own ``Transition``: which call, which states). The
        timers the net's claim clears (its ``Claim``: at the claim, or once the provider has
        done it), as the transition runner clears them; without a claim, a destroy clears
        both timers once done (boot failure's, the oracle's and the merged check's)."""
        now = self.q.now
        op, detector = transition.operation, transition.detector
        if op == "destroy" and fc is not None and m.healthy_truth(now):
            self.metrics.healthy_destroys += 1
            self._broken(f"{detector} destroyed machine {m.id}, healthy by construction")
        for f in m.life_failures:
            if f.caught_at is None and f.cls in USELESS_CLASSES:
                self._caught(f, detector)
        m.intent = transition.intent.value
        # The claim adds a running spot machine's run to its history, as the reaper's does.
        spot = m.offering.capacity_type == CapacityType.SPOT
        m.spot_seconds += spot_history.claimed_s(spot, m.state, self._first_observed_at(m, now), dt(now))
        self._move(m, transition.transitional.value, lifecycle.Actor.REAPER)
        if claim is not None:
            self._clear(m, (c.key for c in claim.clear_at_begin))
            m.clear_at_end = tuple(c.key for c in claim.clear_at_end)
        else:
            m.clear_at_end = ("stop_due_at", "destroy_due_at") if op == "destroy" else ()
        if fc is not None:
            self._ledger(fc, m, "reaper")
        by: Caller = "oracle" if detector == "oracle" else "reaper"
        self._call(m, op, lambda outcome: self._stopped(m, op, outcome), by)

    def _stopped(self, m: Machine, op: str, outcome: str) -> None:
        now = self.q.now
        if outcome != "ok":
            # The call raised (refused, or its answer lost): the transition runner's ledger
            # row, and the machine stays in its transitional state.
            self._ledger(FailureClass.PROVIDER_CALL_FAILED, None, "reaper")
        if outcome == "refused":
            f = self._inject(m, "call_failed", now)
            if self.policy == "oracle":
                self._oracle_finish(m, f)
            return
        self._provider_does(m, op)
        if outcome == "lost":
            f = self._inject(m, "answer_lost", now)
            if self.policy == "oracle":
                self._oracle_finish(m, f)
            return
        self._finish(
            m, MachineState.STOPPED if op == "stop" else MachineState.DESTROYED, lifecycle.Actor.REAPER
        )

    def _provider_does(self, m: Machine, op: str) -> None:
        now = self.q.now
        self._bill(m, now)
        m.recorded_first_observed = m.first_observed(now)
        m.inst_status = "STOPPED" if op == "stop" else "TERMINATED"
        m.earlier_seen_at = m.provider_seen_at(now)  # the last listing, before the life ends
        m.run_since = INF
        m.earlier_probe_ok_at = m.probe_ok_at(now) or m.earlier_probe_ok_at
        if m.startup_done_at < INF:
            m.earlier_report_at = m.worker_report_at(now, self.heartbeat_s)
        m.reachable_since = INF
        m.unreachable_since = INF
        for f in m.life_failures:
            if f.cls == "path_drop" and f.caught_at is None:
                # The machine left before the path was judged: nothing is routed to it now.
                self._caught(f, "machine left")
        m.life += 1  # whatever this life had scheduled is void

    def _provider_does_unless_done(self, m: Machine, op: str) -> None:
        """A stop or destroy carried out again (a re-issue, or one whose answer no one read):
        an instance already gone, or already stopped for a stop, is left as it is."""
        if m.inst_status not in ("", "TERMINATED") and not (op == "stop" and m.inst_status == "STOPPED"):
            self._provider_does(m, op)

    def _finish(self, m: Machine, end: str, by: lifecycle.Actor) -> None:
        if m.state == end:
            return
        self._move(m, end, by)
        if by is lifecycle.Actor.REAPER and m.clear_at_end:
            self._clear(m, m.clear_at_end)
            m.clear_at_end = ()
        # (A STOPPED machine's lost mark, if any, stays on the row until a start's answer
        # clears it.)
        for a in _live(m):
            # No writer of the services moves a machine with live work to STOPPED or
            # DESTROYED: a net's claim requires none, and a loss ends them through the
            # ledger first. One here means the simulator's copy drifted.
            self._broken(f"machine {m.id} became {end} with attempt {a.id} still live")
            self._end_attempt(a, EndCause.MACHINE_LOST, Mover.MACHINE_LOSS)

    # -- the nets ------------------------------------------------------------------------

    def _push_pass(self, name: str, at: float) -> None:
        self.pass_tokens += 1
        token = self.pass_tokens
        self.next_pass[name] = (at, token)
        self.q.at(at, partial(self._net_pass, name, token), self.net_rank[name])

    def _wake(self, name: str, t: float) -> None:
        """Something in ``name``'s scan can match from ``t``: make sure a pass runs at the
        first point of its cadence's grid that would read it — at ``now`` itself if that
        pass is still to run in this instant (its rank is after the running event's)."""
        if self.evaluate_everything:
            return  # every pass is pushed anyway
        at = self._first_pass(self.loops[name], t, self.net_rank[name])
        if at <= self.end and at < self.next_pass.get(name, (INF, 0))[0]:
            self._push_pass(name, at)

    def _net_pass(self, name: str, token: int) -> None:
        """One pass of net ``name`` (its rows read and decided by its handler), then the
        next: one cadence on when every pass runs; otherwise the first at which something
        it reads can be due (its schedule's earliest row, a watch list not empty)."""
        if self.next_pass.get(name, (INF, 0))[1] != token:
            return  # a pass pushed earlier took its place
        del self.next_pass[name]
        now = self.q.now
        # The control plane restarting, or (a reaper net) no reaper leader: a paused one holds
        # its lease until it runs out, and its standby's passes begin once it has.
        down = max(self.down_until, self.reaper_paused_until if name in self.reaper_nets else 0.0)
        if now >= down:
            if self.evaluate_everything:
                self.net_passes[name] += 1
            NET_HANDLERS[name](self, now)
        if self.evaluate_everything:
            self._push_pass(name, self.loops[name].after(now))
            return
        if now < down:
            self._wake(name, down)
            return
        wake = self._next_wake(name)
        if wake < INF:
            self._wake(name, wake)

    def _next_wake(self, name: str) -> float:
        """When net ``name`` next has something to read: its schedule's earliest row, or
        now for a net that reads a watch list while the list holds anything."""
        now = self.q.now
        if name == "idle_scanner":
            return now if self.idle_watch else INF
        if name == "inventory_reconcile":
            return now if self.recon_watch else INF
        if name == "orphan_sweep":
            return now if self.orphans or self.orphan_tracked else INF
        heap, due = self.due_heap[name], self.due[name]
        while heap and due.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # no longer scheduled, or scheduled again earlier
        return heap[0][0] if heap else INF

    def _watch(self, name: str, watch: set[str], mid: str) -> None:
        """``mid`` joins a net's watch list: the net reads it at its next pass."""
        watch.add(mid)
        self._wake(name, self.q.now)

    def _count_passes(self) -> None:
        """The passes a month that runs every pass would have counted: each point of a
        net's grid up to the end at which the control plane was up."""
        for name in self.scheduled_nets():
            self.net_passes[name] = self.loops[name].count(self.end)

    def _pop_due(self, net: str, now: float) -> list[Machine]:
        due, heap = self.due[net], self.due_heap[net]
        ready = []
        while heap and heap[0][0] <= now:
            t, mid = heapq.heappop(heap)
            if due.get(mid) == t:
                del due[mid]
                ready.append(mid)
        return [self.machines[mid] for mid in sorted(ready) if mid in self.live]

    @staticmethod
    def _first_observed_at(m: Machine, now: float) -> datetime | None:
        first = m.first_observed(now)
        return dt(first) if first < INF else None

    def snapshot(self, m: Machine, now: float) -> MachineSnapshot:
        return MachineSnapshot(
            machine_id=m.id,
            origin="PROVISIONED",
            managed=True,
            state=m.state,
            intent=m.intent,
            workload_class="REPORTING",
            live_attempts=len(_live(m)),
            first_observed_at=self._first_observed_at(m, now),
            stop_due_at=m.stop_due_at,
            destroy_due_at=m.destroy_due_at,
            agent_address="sim",
            provider_instance_id=m.provider_instance_id,
            lost=m.lost,
            requested_at=m.requested_at,
            provision_deadline_at=m.provision_deadline_at,
            state_changed_at=m.state_changed_at,
            startup_failed_at=m.startup_failed_at,
            provider_seen_at=m.provider_seen_at(now),
            probe_ok_at=m.probe_ok_at(now),
            probe_failed_since=m.probe_failed_since(now),
            worker_report_at=m.worker_report_at(now, self.heartbeat_s),
            warm_held=m.warm_held,
        )

    def _refused(self, net: str, reason: RefusalReason) -> None:
        self.metrics.refusals[f"{net}:{reason.value}"] += 1

    def _net_idle_scanner(self, now: float) -> None:
        policy = self.idle_policy
        nowd = dt(now)
        for mid in sorted(self.idle_watch):
            m = self.machines[mid]
            if m.state == MachineState.DESTROYED or m.state not in RUNNING_STATES:
                self.idle_watch.discard(mid)
                continue
            sample = None
            if m.agent_reachable(now):
                busy = bool(m.attempts) and (m.reporting(now) or m.gpu_stuck_busy)
                sample = idle_scanner.UtilisationSample(
                    gpu_utilization_percent=90.0 if busy or m.gpu_stuck_busy else 0.0,
                    running_attempts=len(m.attempts) if m.reporting(now) else 0,
                    requests_since_last_sample=0,
                )
            actions = idle_scanner.decide(nowd, self.snapshot(m, now), sample, policy)
            self.metrics.decisions["idle_scanner"] += 1
            settled = sample is not None
            for act in actions:
                if isinstance(act, idle_scanner.ArmIdleTimers | idle_scanner.ClearIdleTimers):
                    self._write(m, act.values)
            if settled:
                self.idle_watch.discard(mid)

    def _net_auto_stop(self, now: float) -> None:
        # A pinned warm machine is read again while its timer stands, as the scan reads it at
        # every pass; the pin going lets the stop through.
        self._one_step_net(now, auto_stop.SPEC, self.auto_stop_policy)

    def _net_auto_destroy(self, now: float) -> None:
        self._one_step_net(now, auto_destroy.SPEC, self.auto_destroy_policy)

    def _net_provision_deadline(self, now: float) -> None:
        self._one_step_net(now, provision_deadline.SPEC, self.provision_deadline_policy)

    def _one_step_net(
        self,
        now: float,
        spec: OneStepSpec[P, A],
        policy: P,
        seen: Callable[[MachineSnapshot], MachineSnapshot] | None = None,
    ) -> None:
        """A net whose decision is act, refuse or nothing (production's generic runner's
        spec): its due rows decided with its real policy and acted on as the spec says (the
        transition, the ledger class); a row it refuses is read again at its next pass while
        the net's own ``due_at`` still selects it, as its scan would."""
        net = spec.name
        for m in self._pop_due(net, now):
            row = self.snapshot(m, now)
            snap = seen(row) if seen is not None else row
            d = spec.decide(dt(now), snap, policy)
            self.metrics.decisions[net] += 1
            if isinstance(d, spec.acts):
                if m.warm_held and net in ("auto_stop", "auto_destroy"):
                    self._broken(f"{net} took machine {m.id}, pinned as its pool's warm capacity")
                claim = spec.claim(dt(now), snap, d, policy)
                self._stop_or_destroy(m, spec.transition, spec.detects, claim)
                continue
            if isinstance(d, Refuse):
                self._refused(net, d.reason)
            self._read_again(net, m, spec.due_at(row, policy), now)

    def _net_boot_failure(self, now: float) -> None:
        policy = self.boot_policy
        for m in self._pop_due("boot_failure", now):
            snap = self.snapshot(m, now)
            if boot_failure.gate(dt(now), snap, policy) is None:
                continue
            probe = None
            if m.agent_reachable(now):
                probe = StartupProbe(
                    startup_complete=m.startup_done_at <= now,
                    startup_error="",
                    worker_alive=m.worker_stopped_at > now,
                )
            self.metrics.decisions["boot_failure"] += 1
            for act in boot_failure.decide(dt(now), snap, probe, policy):
                if isinstance(act, boot_failure.DestroyMachine):
                    self._stop_or_destroy(m, boot_failure.DESTROY, FailureClass.BOOT_FAILED)
                    break
                if isinstance(act, boot_failure.RecordStartupFailure | boot_failure.ClearStartupFailure):
                    self._write(m, act.values)
                elif isinstance(act, Refuse):
                    self._refused("boot_failure", act.reason)
            else:
                # Read again while it has not reported this life.
                self._read_again("boot_failure", m, boot_failure.due_at(snap, policy), now)

    def _net_went_silent(self, now: float) -> None:
        seen = None
        if self.plant == "went_silent_reads_composite":
            # The planted bug: the net decides on the freshest of the three channels.
            def seen(snap: MachineSnapshot) -> MachineSnapshot:
                fresh = max(c for c in (snap.worker_report_at, snap.probe_ok_at, snap.provider_seen_at) if c)
                return replace(snap, worker_report_at=fresh)

        self._one_step_net(now, went_silent.SPEC, self.silent_policy, seen)

    def _net_lost_detector(self, now: float) -> None:
        policy = self.lost_policy
        for m in self._pop_due("lost_detector", now):
            row = self.snapshot(m, now)
            d = lost_detector.decide(dt(now), row, policy)
            self.metrics.decisions["lost_detector"] += 1
            if isinstance(d, lost_detector.MarkLost):
                self._write(m, d.values)
                self._ledger(d.detects, None, "reaper")  # the row alone: the mark is the act
                for f in m.life_failures:
                    if f.cls == "path_drop" and f.caught_at is None:
                        self._caught(f, "lost_detector")
                self._touch(m.offering.pool)
            elif isinstance(d, lost_detector.UnmarkLost):
                self._write(m, d.values)
                self._touch(m.offering.pool)
            else:
                if isinstance(d, Refuse):
                    self._refused("lost_detector", d.reason)
                # Read again while its probe has failed long enough; a lost machine is
                # read when a probe succeeds again (``_reach``).
                self._read_again("lost_detector", m, lost_detector.due_at(row, policy), now)

    def _net_merged_check(self, now: float) -> None:
        """The counterfactual: one composite freshness over the three channels, behind the
        same ladder (its grace is the boot window it must not kill)."""
        threshold = timedelta(seconds=self.cfg.merged_threshold_s)
        gates = NetGates(net=MERGED_CHECK, grace=self.silent_policy.grace, reads_reports=False)
        for m in self._pop_due(MERGED_CHECK, now):
            snap = self.snapshot(m, now)
            if m.state not in RUNNING_STATES:
                continue
            heard = [c for c in (snap.worker_report_at, snap.probe_ok_at, snap.provider_seen_at) if c]
            newest = max(heard) if heard else snap.requested_at or dt(now)
            self.metrics.decisions[MERGED_CHECK] += 1
            if dt(now) - newest < threshold:
                self._due(MERGED_CHECK, m, secs(newest + threshold))
                continue
            reason = first_refusal(dt(now), snap, gates)
            if reason is not None:
                self._refused(MERGED_CHECK, reason)
                self._due(MERGED_CHECK, m, self._next_pass_of(now))
                continue
            self._stop_or_destroy(m, destroy_transition(MERGED_CHECK), FailureClass.WENT_SILENT)

    def _net_stuck_transition(self, now: float) -> None:
        policy = self.stuck_policy
        for m in self._pop_due("stuck_transition", now):
            snap = self.snapshot(m, now)
            gated = stuck_transition.gate(dt(now), snap, policy)
            if gated is None:
                self._due_stuck(m)
                continue
            status = m.inst_status or stuck_transition.GONE
            view = stuck_transition.ProviderView(status=status, provider_instance_id=m.instance_id)
            rows = m.ledger_rows
            reissued = stuck_transition.this_transition(snap, rows.get(_REISSUED, ()))
            d = stuck_transition.decide(dt(now), snap, view, policy, reissued)
            self.metrics.decisions["stuck_transition"] += 1
            for f in m.life_failures:
                if f.cls in ("call_failed", "call_timed_out", "answer_lost") and f.caught_at is None:
                    self._caught(f, "stuck_transition")
            if isinstance(d, stuck_transition.FinishTransition):
                self._finish_transition(m, d)
            elif isinstance(d, stuck_transition.AlertStuck):
                # The scan reads it again every tick; the incident is opened once.
                self._due("stuck_transition", m, self._next_pass_of(now))
                if stuck_transition.opens_incident(snap, rows.get(_STUCK, ())):
                    self._ledger(FailureClass.TRANSITION_STUCK, m, "reaper")
                    self.q.after(self.cfg.faults.human_response_s, partial(self._human, m))
            elif isinstance(d, stuck_transition.ReissueCall):
                # The ledger row first (the intent is on the row already), then the call.
                self._ledger(FailureClass.TRANSITION_REISSUED, m, "reaper")
                op = d.operation
                self._call(m, op, partial(self._reissue_answered, m, op, snap), "reaper")
                self._due("stuck_transition", m, self._next_pass_of(now))
            elif isinstance(d, Refuse):
                self._refused("stuck_transition", d.reason)
                self._due("stuck_transition", m, self._next_pass_of(now))
            else:  # a re-issued call may still be under way: read again next pass
                self._due("stuck_transition", m, self._next_pass_of(now))

    def _finish_transition(self, m: Machine, finish: stuck_transition.FinishTransition) -> None:
        """A transition the net finished, with the columns its writer writes beside the state
        (``stuck_transition.finish_values``)."""
        now = self.q.now
        self._write(m, stuck_transition.finish_values(finish, self.snapshot(m, now), dt(now)))
        if finish.end is MachineState.BOOTING:
            self._move(m, MachineState.BOOTING, lifecycle.Actor.REAPER)
            self._watch_boot(m, now)
        else:
            self._finish(m, finish.end.value, lifecycle.Actor.REAPER)

    def _reissue_answered(self, m: Machine, op: str, read: MachineSnapshot, outcome: str) -> None:
        """A re-issued stop or destroy: done (the transition ends, if the row is still in
        the transition the net read: ``finish_holds``), refused (nothing done; the net reads
        again), or done with its answer lost (the next read finishes it). The provider
        carries the call out whatever the row says by then, as it would for the reaper."""
        if outcome != "ok":  # the re-issued call raised: the net's ledger row
            self._ledger(FailureClass.PROVIDER_CALL_FAILED, None, "reaper")
        if outcome == "refused":
            return
        self._provider_does_unless_done(m, op)
        if outcome == "ok" and stuck_transition.finish_holds(read, self.snapshot(m, self.q.now)):
            end = MachineState.STOPPED if op == "stop" else MachineState.DESTROYED
            self._finish_transition(m, stuck_transition.FinishTransition(end))

    def _human(self, m: Machine) -> None:
        """An operator answers the incident: the call is made again (or the row ended when
        the provider has nothing)."""
        if m.state not in TRANSITIONAL_STATES:
            return
        if m.state == MachineState.PROVISIONING and not m.inst_status:
            m.intent = MachineIntent.DESTROYED
            self._move(m, MachineState.DESTROYED, lifecycle.Actor.REAPER)
        elif m.state == MachineState.STARTING and m.inst_status == "STOPPED":
            self._finish(m, MachineState.STOPPED, lifecycle.Actor.REAPER)
        elif m.state in (MachineState.STOPPING, MachineState.DESTROYING):
            op = "stop" if m.state == MachineState.STOPPING else "destroy"
            self._call(m, op, lambda outcome: self._stopped(m, op, outcome), "human")

    def _net_inventory_reconcile(self, now: float) -> None:
        if not self.recon_watch:
            return
        ms = [self.machines[mid] for mid in sorted(self.recon_watch) if mid in self.live]
        rows = [
            inventory_reconcile.ReconcileMachine(
                machine_id=m.id,
                provider=m.offering.provider,
                provider_instance_id=m.provider_instance_id,
                origin="PROVISIONED",
                managed=True,
                state=m.state,
                intent=m.intent,
                capacity_type=m.offering.capacity_type,
                state_changed_at=m.state_changed_at,
                provider_seen_at=m.provider_seen_at(now),
                requested_at=m.requested_at,
            )
            for m in ms
        ]
        listed = [
            ListedInstance(
                provider=m.offering.provider,
                provider_instance_id=m.provider_instance_id or "",
                machine_label=m.id,
                status=m.inst_status,
                deployment_label=DEPLOYMENT,
            )
            for m in ms
            if m.inst_status not in ("", "TERMINATED")
        ]
        d = inventory_reconcile.decide(dt(now), rows, listed, [], self.not_listed_grace)
        self.metrics.decisions["inventory_reconcile"] += len(rows)
        if d.not_yet_listed:
            # Never listed yet, created within the grace: kept, and read at the next pass;
            # one ledger row a machine, on its first missing list (record_not_yet_listed).
            self.metrics.refusals["inventory_reconcile:NOT_YET_LISTED"] += len(d.not_yet_listed)
            for mid in d.not_yet_listed:
                if mid not in self.not_yet_listed_recorded:
                    self.not_yet_listed_recorded.add(mid)
                    self._ledger(FailureClass.NOT_YET_LISTED, None, "sweeper")
        for mid in d.seen + d.not_reconciled:
            self.recon_watch.discard(mid)
        for loss in d.losses:
            m = self.machines[loss.machine_id]
            self.recon_watch.discard(m.id)
            self._record_loss(m, loss, "inventory_reconcile")

    def _record_loss(self, m: Machine, loss: MachineLoss, by: str) -> None:
        """A loss as the sweeper writes it (``machine_loss.loss_update``): its ledger row,
        then the machine following the provider, its pre-emption history and timers."""
        for f in m.life_failures:
            if f.cls == "preemption" and f.caught_at is None:
                self._caught(f, by)
        now = self.q.now
        update = loss_update(loss, self._first_observed_at(m, now), dt(now))
        m.preemptions += update.preemptions_added
        m.spot_seconds += update.spot_seconds_added
        self._ledger(loss.failure_class, m, "sweeper")
        m.intent = update.intent.value
        self._finish(m, update.end_state.value, lifecycle.Actor.SWEEPER)
        self._clear(m, update.clears)

    def _net_orphan_sweep(self, now: float) -> None:
        policy = self.orphan_policy
        if not self.orphans and not self.orphan_tracked:
            return
        instances = [inst for inst, _, _ in self.orphans.values()]
        inventory = orphan_sweep.Inventory(machine_ids=frozenset(), instance_keys=frozenset())
        d = orphan_sweep.decide(dt(now), instances, [], inventory, self.orphan_tracked, policy)
        self.metrics.decisions["orphan_sweep"] += len(instances)
        for view in d.orphans:
            self.orphan_tracked[view.key] = orphan_sweep.TrackedOrphan(view.first_seen_at, view.action.value)
            if view.newly_found and view.action is not OrphanAction.RECORDED:
                self._ledger(FailureClass.ORPHAN_FOUND, None, "sweeper")  # orphan_rows.found's
            if view.action is OrphanAction.DESTROYING:
                # Every pass that still lists it calls again (the call is idempotent).
                self._destroy_orphan(view.instance.provider_instance_id, "orphan_sweep")
        for key, _ in d.settled:
            self.orphan_tracked.pop(key, None)

    def _destroy_orphan(self, iid: str, by: str) -> None:
        entry = self.orphans.get(iid)
        if entry is None:
            return
        for f in self.failures:
            if f.cls == "orphan" and f.machine_id == iid and f.caught_at is None:
                self._caught(f, by)

        def answered(outcome: str, epoch: int) -> None:
            # (An answer no one reads, its caller gone in a restart, writes no row.)
            if outcome != "ok" and epoch == self.epoch:  # the sweep's row; the next pass tries again
                self._ledger(FailureClass.PROVIDER_CALL_FAILED, None, "sweeper")
            if outcome == "refused":
                return
            entry = self.orphans.pop(iid, None)
            if entry is not None:
                self._bill_orphan(entry[1], entry[2], self.q.now)

        self.metrics.provider_calls += 1
        latency, outcome = self._answer("destroy", entry[2].zone)
        self.q.after(latency, partial(answered, outcome, self.epoch))

    # -- the oracle: each failure dealt with the instant it happens ----------------------

    def _oracle_destroy(self, m: Machine) -> None:
        for a in _live(m):
            self._end_attempt(a, EndCause.MACHINE_LOST, Mover.MACHINE_LOSS)
        self._clear_timers(m)
        if m.state in RUNNING_STATES or m.state == MachineState.PROVISIONING:
            self._stop_or_destroy(m, destroy_transition("oracle"), None)

    def _oracle_lost(self, m: Machine, f: Failure, lost: bool) -> None:
        m.lost = lost
        if lost:
            self._caught(f, "oracle")
        self._touch(m.offering.pool)

    def _oracle_finish(self, m: Machine, f: Failure) -> None:
        self._caught(f, "oracle")
        if m.state == MachineState.PROVISIONING:
            if m.inst_status:
                self._move(m, MachineState.BOOTING, lifecycle.Actor.REAPER)
            else:
                m.intent = MachineIntent.DESTROYED
                self._move(m, MachineState.DESTROYED, lifecycle.Actor.REAPER)
        elif m.state == MachineState.STARTING:
            if m.inst_status == "RUNNING":
                self._move(m, MachineState.BOOTING, lifecycle.Actor.REAPER)
            else:
                self._finish(m, MachineState.STOPPED, lifecycle.Actor.REAPER)
        elif m.state in (MachineState.STOPPING, MachineState.DESTROYING):
            want = "STOPPED" if m.state == MachineState.STOPPING else "TERMINATED"  # the provider's word
            if m.inst_status == want:
                self._finish(
                    m,
                    MachineState.STOPPED if want == "STOPPED" else MachineState.DESTROYED,
                    lifecycle.Actor.REAPER,
                )
            else:
                op = "stop" if m.state == MachineState.STOPPING else "destroy"
                self._call(m, op, lambda outcome: self._stopped(m, op, outcome), "oracle")

    # -- the environment: pre-emptions, stockouts, orphans, restarts, pauses ------------

    def _preempt(self, m: Machine, life: int) -> None:
        """The provider takes a spot instance back (only while it runs here: a machine
        mid-transition is left to that transition)."""
        if not self._alive(m, life) or m.state not in RUNNING_STATES or m.intent != MachineIntent.RUNNING:
            return
        now = self.q.now
        f = self._inject(m, "preemption", now)
        if lifecycle.not_yet_listed(m.requested_at, m.provider_seen_at(now), dt(now), self.not_listed_grace):
            # Never listed, and created within the grace: the reconcile keeps the record (a
            # list lags creates) until the grace has passed, as the design means it to.
            assert m.requested_at is not None
            f.held_s = secs(m.requested_at) + self.not_listed_grace.total_seconds() - now
        self._provider_does(m, "destroy")
        if self.policy == "oracle":
            taken = classify_loss(m.offering.capacity_type, "TERMINATED")
            assert taken is not None
            kind, end = taken
            self._record_loss(
                m, MachineLoss(m.id, kind, end, "TERMINATED", m.state, m.state_changed_at), "oracle"
            )
            return
        self._watch("inventory_reconcile", self.recon_watch, m.id)

    def _environment(self) -> None:
        f = self.cfg.faults
        rng = self.rng_env
        zones = sorted({o.zone for o in self.offerings})
        for zone in zones:
            t = 0.0
            while f.stockouts_per_zone_month > 0:  # (a profile without them draws none)
                t += rng.expovariate(f.stockouts_per_zone_month / (30 * 86400.0))
                if t > self.end:
                    break
                self.q.at(t, partial(self._stockout, zone, rng.uniform(*f.stockout_s)))
        t = 0.0
        scale = self.cfg.machines / 500.0
        while f.orphans_per_day > 0:
            t += rng.expovariate(f.orphans_per_day * scale / 86400.0)
            if t > self.end:
                break
            self.q.at(t, partial(self._orphan, rng.choice(self.offerings)))
        for kind, per_month in (("restart", f.restarts_per_month), ("pause", f.leader_pauses_per_month)):
            t = 0.0
            while per_month > 0:
                t += rng.expovariate(per_month / (30 * 86400.0))
                if t > self.end:
                    break
                self.q.at(t, partial(self._outage, kind, rng.uniform(20.0, 120.0)))

    def _stockout(self, zone: str, duration: float) -> None:
        self.stockouts[zone] = max(self.stockouts.get(zone, 0.0), self.q.now + duration)

    def _orphan(self, o: Offering) -> None:
        """A create that reached the provider while its record was lost."""
        now = self.q.now
        self.ordinal += 1
        iid = f"i-orphan-{self.ordinal}"
        inst = ListedInstance(
            provider=o.provider,
            provider_instance_id=iid,
            machine_label=f"m{self.ordinal:06d}",
            status="RUNNING",
            deployment_label=DEPLOYMENT,
            launch_time=dt(now),
            instance_type=o.instance_type,
        )
        self.orphans[iid] = (inst, now, o)
        self._wake("orphan_sweep", now)
        f = Failure("orphan", now, machine_id=iid)
        self.failures.append(f)
        if self.policy == "oracle":
            self._destroy_orphan(iid, "oracle")

    def _outage(self, kind: str, duration: float) -> None:
        now = self.q.now
        # The new processes come back on a whole second, so their loops' grids add up
        # exactly (as the services' microsecond clocks do): an outage lasts up to 1 s more.
        ends = float(math.ceil(now + duration))
        cls = "control_plane_restart" if kind == "restart" else "leader_paused"
        f = Failure(cls, now)
        self.failures.append(f)
        self.outages.append((now, ends))
        if kind == "restart":
            # A deploy rolls every service's replicas: the leaders' processes die with what
            # they had in flight (``_call``, ``_started``: answers no one reads), and the new
            # leaders take over when it ends. The workers' calls are answered by the replica
            # still up meanwhile: heartbeats renew leases, completions are recorded.
            self.epoch += 1
            for mid in sorted(self.live):
                for a in self.machines[mid].live_attempts:
                    if a.state == AttemptState.STARTING:
                        self.undispatched[a.id] = a
            self.down_until = max(self.down_until, ends)
            self.q.at(ends, self._back_from_restart)
            back = ends
            # Every loop's new process runs its first pass as it starts, then at its cadence.
            self._loops_anew(list(self.loops), now, back, scheduler=True)
        else:
            # The paused leader's lease runs out (it renews no more) and its standby takes
            # over; one that wakes sooner goes on itself. Its writes after that are fenced.
            back = min(ends, float(math.ceil(now + self.reaper_lease_ttl_s)))
            deposed = duration > self.reaper_lease_ttl_s
            self.reaper_paused_until = max(self.reaper_paused_until, back)
            self.reaper_pause_log.append((now, ends, deposed))
            # The standby's loops start at once when it takes over; a leader that wakes in
            # time runs each pass it owes as it wakes (``next_at`` passed), then on from there.
            nets = [
                n for n in self.loops if n in self.reaper_nets and (deposed or self.loops[n].owes(now, back))
            ]
            self._loops_anew(nets, now, back, scheduler=False)
        # Recovered when it is back: a restart resumes every loop; a new leader takes over.
        self.q.at(back, lambda: self._caught(f, "leadership"))

    def _loops_anew(self, nets: list[str], stopped: float, back: float, *, scheduler: bool) -> None:
        """The loops of the nets named (and, with ``scheduler``, the scheduler's: the fleet
        tick, the pool idle release, the request watchdogs) stop at ``stopped`` and run
        anew from ``back`` (``Passes.restart``), and each pass one of them had pending moves
        to the new grid: a net's to the first pass that reads its earliest due row, a
        request watchdog's jobs each to the first that can act on it. (A tick pending is
        voided by the one ``_back_from_restart`` runs at ``back``.)"""
        for name in nets:
            self.loops[name].restart(stopped, back)
        for name in nets:
            if name not in self.net_rank:
                continue  # not a net this policy runs
            self.next_pass.pop(name, None)
            if self.evaluate_everything:
                self._push_pass(name, self.loops[name].ceil(stopped))
            elif (wake := self._next_wake(name)) < INF:
                self._wake(name, wake)
        if not scheduler:
            return
        self.tick_loop.restart(stopped, back)
        self.pool_idle_loop.restart(stopped, back)
        for loop in self.job_loops.values():
            loop.restart(stopped, back)
        if self.evaluate_everything:
            self.chain[pool_idle.NAME] += 1
            first = self.pool_idle_loop.ceil(stopped)
            self.q.at(first, partial(self._pool_idle_pass, self.chain[pool_idle.NAME]), POOL_IDLE_RANK)
            for name, loop in self.job_loops.items():
                self.chain[name] += 1
                self.q.at(
                    loop.ceil(stopped), partial(self._job_pass, name, self.chain[name]), JOB_WATCHDOG_RANK
                )
            return
        if self.pool_idle_due:
            self._pool_idle_wake(min(self.pool_idle_due.values()))
        for name, loop in self.job_loops.items():
            pending = self.job_due[name]
            jobs = {j.id: j for at in sorted(pending) for j in pending[at] if j.state == JobState.QUEUED}
            pending.clear()
            for j in jobs.values():
                self._job_pass_at(name, max(loop.after(self._job_due_at(name, j)), loop.ceil(stopped)), [j])

    # -- bookkeeping ------------------------------------------------------------------------

    def _inject(self, m: Machine, cls: str, at: float) -> Failure:
        self._segment(m)
        f = Failure(cls, at, machine_id=m.id)
        m.life_failures.append(f)
        self.failures.append(f)
        if cls == "clock_skew":
            f.caught_at, f.caught_by = at, "n/a"
        if cls == "provision_stall" and self.policy == "oracle":
            self.q.after(0.0, lambda: self._oracle_destroy(m))
        if cls == "boot_never_completes" and self.policy == "oracle":
            self.q.after(0.0, lambda: self._oracle_destroy(m))
        return f

    def _caught(self, f: Failure, by: str) -> None:
        m = self.machines.get(f.machine_id)
        if m is not None:
            self._segment(m)
        if f.caught_at is None:
            f.caught_at = self.q.now
            f.caught_by = by
            f.outage_s = sum(max(0.0, min(b, f.caught_at) - max(a, f.at)) for a, b in self.outages)

    def _checked(self, check: Callable[Move, object], *move: Move.args, **named: Move.kwargs) -> None:
        """A job or attempt move held to the job lifecycle's tables (``check(*move)``, as the
        services' one writer holds every move): one the tables refuse is an invariant broken."""
        try:
            check(*move, **named)
        except IllegalJobTransition as e:
            self._broken(str(e))

    def _broken(self, what: str) -> None:
        message = f"{what} at {dt(self.q.now).isoformat()} (seed {self.cfg.seed}, policy {self.policy})"
        if self.strict:
            raise InvariantBroken(message)
        self.violations.append(message)

    def _sample(self) -> None:
        now = self.q.now
        by_state = Counter(self.machines[m].state for m in self.live)
        billed, useful = self.metrics.billed_s, self.metrics.useful_s
        for mid in self.live:
            m = self.machines[mid]
            if m.bill_from is not None:
                billed += now - m.bill_from
            if m.useful_from is not None:
                useful += now - m.useful_from
        self.metrics.samples.append((now, dict(by_state), billed, useful))
        self._check_books(now)
        self.q.at(now + 3600.0, self._sample, SAMPLE_RANK)

    def _check_books(self, now: float) -> None:
        """Every instance the provider bills is known here or is an orphan being swept;
        no job is lost."""
        for mid in self.live:
            m = self.machines[mid]
            if m.bill_from is not None and m.inst_status not in ("RUNNING", "PENDING"):
                self._broken(f"machine {m.id} billed while the provider says {m.inst_status}")
        for pool, queue in self.queued.items():
            for job in queue.values():
                if job.state != JobState.QUEUED or job.live is not None:
                    self._broken(f"job {job.id} in the queue of {pool} while {job.state}")
            by_ws = [j.id for jobs in self.ws_queue[pool].values() for j in jobs]
            if sorted(by_ws) != sorted(queue) or any(
                [j.id for j in jobs] != sorted(j.id for j in jobs) for jobs in self.ws_queue[pool].values()
            ):
                self._broken(f"the workspaces' queues of {pool} are not its queue, oldest first")
        for mid in self.live:
            for a in _live(self.machines[mid]):
                if a.job.live is not a:
                    self._broken(f"attempt {a.id} holds a slot but is not its job's live attempt")

    def _close_books(self) -> None:
        now = self.end
        self.fairness.close(now)
        for mid in list(self.live):
            m = self.machines[mid]
            self._bill(m, now)
        for _, launched, o in self.orphans.values():
            self._bill_orphan(launched, o, now)
        self._check_books(now)
        for job in self.jobs.values():
            if job.state == JobState.QUEUED and job.id not in self.queued[job.pool]:
                self._broken(f"job {job.id} lost: queued in no queue")
            elif job.state in (JobState.DISPATCHING, JobState.RUNNING) and job.live is None:
                self._broken(f"job {job.id} lost: running with no live attempt")

    def _bill_orphan(self, launched: float, o: Offering, now: float) -> None:
        """An orphan bills and never does useful work."""
        span = now - launched
        self.metrics.idle_by_cause["orphan (until swept)"] += span
        self.metrics.billed_s += span
        self.metrics.cost_micros += span * o.hourly_price_micros / 3600.0


NetHandler = Callable[[Sim, float], None]

# Ranks of the grid loops among one instant's events (EventQueue): the world's events, the
# hourly sample, the nets (Sim.net_rank), then the fleet tick.
SAMPLE_RANK = 1
POOL_IDLE_RANK = 99
JOB_WATCHDOG_RANK = 98
QUEUE_WAIT, PAID_WAIT = queue_wait.NAME, paid_wait.NAME
TICK_RANK = 100

# Each registered net's model, by the registry's name (gpufleet.common.nets): a net the
# registry says the simulator models and that has no handler here, or a handler for a net
# it does not list, fails the import below.
NET_HANDLERS: dict[str, NetHandler] = {
    "idle_scanner": Sim._net_idle_scanner,
    "auto_stop": Sim._net_auto_stop,
    "auto_destroy": Sim._net_auto_destroy,
    "provision_deadline": Sim._net_provision_deadline,
    "boot_failure": Sim._net_boot_failure,
    "went_silent": Sim._net_went_silent,
    "lost_detector": Sim._net_lost_detector,
    "stuck_transition": Sim._net_stuck_transition,
    "inventory_reconcile": Sim._net_inventory_reconcile,
    "orphan_sweep": Sim._net_orphan_sweep,
}
net_registry.check_covers("the simulator", tuple(NET_HANDLERS), net_registry.simulated())
NET_HANDLERS[MERGED_CHECK] = Sim._net_merged_check


def _live(m: Machine) -> list[Attempt]:
    """The machine's live attempts, each once (a film holds every slot)."""
    return list(m.live_attempts)


def _just_after(t: float) -> float:
    """The first instant after ``t``: a gate that opens once time is past ``t`` (a strict
    comparison) is read by the first tick after it, even when ``t`` is on the tick's grid."""
    return math.nextafter(t, math.inf)


def _pick(rng: random.Random, table: tuple[tuple[str, float], ...]) -> str:
    return rng.choices([k for k, _ in table], weights=[w for _, w in table])[0]


def _lognorm(rng: random.Random, p50: float, p_hi: float, z: float, cap: float) -> float:
    sigma = math.log(p_hi / p50) / z
    return min(rng.lognormvariate(math.log(p50), sigma), cap)


def _earmark_row(m: Machine) -> EarmarkRow:
    return EarmarkRow(m.id, MachineState(m.state), m.earmarked_for)
