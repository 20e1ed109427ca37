"""What a simulated month is made of: the offerings (a data file with its sources), the
workload and the fault profile.

Every number here is a default a run can change, and each says where it comes from. The
rates are per machine-month or per call, so a 100-machine run and a 2,000-machine run meet
the same world, scaled.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from gpufleet.common.catalog import PoolSpec

# A catalogue pool's idle time before its warm capacity is released, unless it sets one.
IDLE_RELEASE_AFTER_S: float = PoolSpec.model_fields["idle_release_after_s"].default

# AWS Spot Advisor's "frequency of interruption" buckets, per month: the middle of each
# (the last one, "> 20 %", is taken as 25 %).
INTERRUPTION_BUCKETS: dict[str, float] = {
    "<5%": 0.025,
    "5-10%": 0.075,
    "10-15%": 0.125,
    "15-20%": 0.175,
    ">20%": 0.25,
}
MONTH_S = 30 * 86400.0


@dataclass(frozen=True)
class Offering:
    id: str
    pool: str
    provider: str
    region: str
    zone: str
    instance_type: str
    capacity_type: str
    hourly_usd: float
    # Pre-emptions per machine-second (spot only), from its interruption bucket.
    preempt_rate_s: float
    source: str
    as_of: str

    @cached_property
    def hourly_price_micros(self) -> int:
        return round(self.hourly_usd * 1_000_000)


def load_offerings() -> list[Offering]:
    """The L4 offerings of ``data/l4_offerings.csv``, with where each price comes from."""
    text = (Path(__file__).parent / "data" / "l4_offerings.csv").read_text()
    out = []
    for row in csv.DictReader(text.splitlines()):
        bucket = row["monthly_interruption"]
        monthly = INTERRUPTION_BUCKETS[bucket] if bucket else 0.0
        out.append(
            Offering(
                id=row["id"],
                pool=row["pool"],
                provider=row["provider"],
                region=row["region"],
                zone=row["zone"],
                instance_type=row["instance_type"],
                capacity_type=row["capacity_type"],
                hourly_usd=float(row["hourly_usd"]),
                # A monthly interruption frequency p as a constant hazard: -ln(1 - p) / month.
                preempt_rate_s=-math.log(1.0 - monthly) / MONTH_S if monthly else 0.0,
                source=row["source"],
                as_of=row["as_of"],
            )
        )
    return out


@dataclass(frozen=True)
class KindMix:
    """One job kind of the catalogue and how the workload draws it."""

    kind_id: str
    share: float
    # Log-normal duration: the median and the 90th percentile, in seconds.
    p50_s: float
    p90_s: float


@dataclass(frozen=True)
class Workload:
    # Kinds of seed 001 as the default catalogue names them. Durations: the Alibaba PAI and
    # Microsoft Philly traces give a p50 of 10-20 min and a p90 of 2-3.5 h for GPU jobs;
    # films run several hours on a whole machine; clips are minutes.
    kinds: tuple[KindMix, ...] = (
        KindMix("clip", 0.35, 4 * 60.0, 12 * 60.0),
        KindMix("short_episode", 0.60, 15 * 60.0, 3 * 3600.0),
        KindMix("film", 0.05, 3 * 3600.0, 6 * 3600.0),
    )
    # The average share of the fleet's slots the workload asks for; the daily cycle and the
    # bursts move around it.
    mean_load: float = 0.35
    # Peak to quiet about 4:1: rate x (1 + a sin), a = (4 - 1) / (4 + 1).
    daily_amplitude: float = 0.6
    # Bursts: a few a day, each multiplying the rate for a while.
    bursts_per_day: float = 2.0
    burst_factor: float = 3.0
    burst_s: float = 30 * 60.0
    workspaces: int = 400
    # (plan, share of workspaces); plan tiers and limits are the catalogue's.
    plans: tuple[tuple[str, float], ...] = (("free", 0.6), ("creator", 0.3), ("studio", 0.1))
    # Workspace activity: Pareto with this shape (a few busy studios, many quiet ones).
    activity_shape: float = 2.5
    # Pools by region, and the share of workspaces homed in each.
    regions: tuple[tuple[str, float], ...] = (("l4-us", 0.55), ("l4-eu", 0.3), ("l4-asia", 0.15))
    # Jobs that fail on their own code (charged, not retried by us).
    own_failure_share: float = 0.03


@dataclass(frozen=True)
class Faults:
    """How often each failure class happens. Machine classes are per machine-life
    (a create or a start); the rest as stated."""

    provision_stall: float = 0.01  # the instance runs; its agent never comes up
    boot_never_completes: float = 0.01  # the agent answers; start-up never completes
    worker_dies_per_day: float = 0.01  # per running machine-day
    worker_wedges_per_day: float = 0.005  # alive (GPU stuck busy), not reporting
    path_drops_per_day: float = 0.01  # the control plane cannot reach a healthy machine
    path_heal_s: tuple[float, float] = (60.0, 3 * 3600.0)
    orphans_per_day: float = 0.5  # a create whose record was lost (crash between create and commit)
    stockouts_per_zone_month: float = 3.0
    stockout_s: tuple[float, float] = (1800.0, 6 * 3600.0)
    quota_error: float = 0.002  # per create
    auth_error: float = 0.001  # per create
    call_fails: float = 0.01  # per provider call: refused, nothing done
    call_times_out: float = 0.005  # per call: it took effect, the answer never came
    answer_lost: float = 0.01  # per stop/destroy: done at the provider, answer lost
    restarts_per_month: float = 4.0  # control plane restarted (20-120 s down)
    leader_pauses_per_month: float = 4.0  # the reaper's leader paused past its lease
    clock_skew_share: float = 0.05  # machines whose clock is off by up to 10 min
    human_response_s: float = 3600.0  # an incident is looked at within this


@dataclass(frozen=True)
class Timing:
    """Boot times (s): the VM and agent up, then start-up (image pull, drivers) done."""

    agent_up_p50_s: float = 90.0
    agent_up_p99_s: float = 8 * 60.0
    startup_p50_s: float = 3 * 60.0
    # Cold image pulls: a long tail, up to the slowest boot the design is sized for: a
    # healthy boot reports within startup_max_s of the instance starting, under the 30-min
    # boot window (a slower one is, by the seed's definition, a boot failure).
    startup_p99_s: float = 18 * 60.0
    startup_max_s: float = 25 * 60.0
    call_s: tuple[float, float] = (2.0, 40.0)  # provider call latency
    dispatch_s: float = 2.0  # StartJob to running
    heartbeat_s: float = 10.0


@dataclass(frozen=True)
class ScriptedJob:
    """One job of a script: it arrives at ``at`` and runs ``run_s`` once started."""

    at: float
    workspace: str
    kind: str
    run_s: float


@dataclass(frozen=True)
class Script:
    """One fixed world in place of the drawn one, so that the simulator and the services can
    be driven through the same story (``tests/integration/sim/test_sim_vs_services.py``):
    one offering, the given workspaces and jobs, every boot alike, every provider call
    answered after ``call_s``, and nothing failing but what it names."""

    offering: Offering
    workspaces: tuple[tuple[str, str], ...]  # (workspace, plan)
    jobs: tuple[ScriptedJob, ...]
    agent_up_s: float = 60.0  # the agent answers this long after the instance runs
    startup_s: float = 60.0  # and the worker first reports this long after that
    call_s: float = 1.0
    # (machine ordinal, seconds after its worker's first report): its worker dies then, or
    # wedges (alive, its GPU stuck busy, reporting no more).
    worker_deaths: tuple[tuple[int, float], ...] = ()
    worker_wedges: tuple[tuple[int, float], ...] = ()
    # Machines (ordinals) whose first life's agent never comes up (a provision stall), or
    # comes up with a start-up that never completes (a boot that never ends).
    stalls: tuple[int, ...] = ()
    boot_hangs: tuple[int, ...] = ()
    # (machine ordinal, seconds after its worker's first report, seconds until it heals):
    # the control plane cannot reach its agent meanwhile (its worker still reports).
    path_drops: tuple[tuple[int, float, float], ...] = ()
    # (machine ordinal, seconds after its worker's first report): the provider takes its
    # instance back (it is gone).
    preemptions: tuple[tuple[int, float], ...] = ()
    # (at, seconds down): the control plane restarts (a deploy rolling its replicas).
    restarts: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class SimConfig:
    days: float = 30.0
    machines: int = 500
    seed: int = 1
    workload: Workload = field(default_factory=Workload)
    faults: Faults = field(default_factory=Faults)
    timing: Timing = field(default_factory=Timing)
    # The fleet tick's cadence. The scheduler's GPUFLEET_TICK_S is 5 s; the simulator ticks
    # every 30 s by default (a month at 5 s takes about 2.3 x as long), which delays a
    # placement by up to 25 s more and changes no net's timing. --tick-s 5 runs the real one.
    tick_s: float = 30.0
    # The merged check's one threshold: permissive enough for the slowest boot.
    merged_threshold_s: float = 30 * 60.0
    # Each pool's warm capacity (the catalogue's ``warm_target``: machines kept running
    # while the pool has work, pinned so the money chain leaves them) and how long the pool
    # is idle before the pool idle release lets them go (``idle_release_after_s``, the
    # catalogue's default). None warm by default, as the catalogue's pools.
    warm_target: int = 0
    idle_release_after_s: float = IDLE_RELEASE_AFTER_S
    # A fixed world instead of the drawn one (the workload, faults and timing unused).
    script: Script | None = None


PROFILES = {
    "default": Faults(),
    # Every rate ten times: a short run still meets every class often.
    "harsh": Faults(
        provision_stall=0.05,
        boot_never_completes=0.05,
        worker_dies_per_day=0.1,
        worker_wedges_per_day=0.05,
        path_drops_per_day=0.1,
        orphans_per_day=3.0,
        stockouts_per_zone_month=15.0,
        quota_error=0.03,
        auth_error=0.01,
        call_fails=0.03,
        call_times_out=0.02,
        answer_lost=0.05,
        restarts_per_month=20.0,
        leader_pauses_per_month=20.0,
    ),
}
