"""Every gpufleet metric, declared once, as data.

An instrument exists only if it is declared here: :mod:`gpufleet.common.metrics.instruments`
creates instruments from these declarations and nowhere else does (a quality test reads
the source for any other ``create_counter``), and ``docs/metrics.md`` is generated from
this module (a test keeps the two equal). So the reference an operator reads, the names a
dashboard or an alert rule queries and what the code records cannot drift apart.

Conventions (OpenTelemetry's metric naming and Prometheus' own):

- Names are OpenTelemetry style: dotted, lower case, ``gpufleet.<area>.<thing>``; a count
  of things is plural (``gpufleet.jobs.submitted``), a duration ends in ``.duration``.
- Units are UCUM as OpenTelemetry writes them: ``s`` for every duration (never ``ms``),
  ``1`` for a ratio, and a curly-brace annotation naming what is counted (``{machine}``)
  for a count, which adds no suffix in Prometheus. Money-time to come (GPU-hours billed,
  idle) is recorded as seconds of GPU time (``s``) and divided by 3600 in a dashboard.
- Each metric's Prometheus name is derived by OpenTelemetry's conversion
  (:func:`prometheus_name`): dots to underscores, the unit's word appended (``_seconds``),
  ``_total`` appended to a counter. The reference shows it, because that is what a
  PromQL user types.
- Labels come from one closed vocabulary, :data:`LABELS`, each with what keeps its values
  few. A job, an attempt, a machine or a workspace is never a label
  (:data:`FORBIDDEN_LABEL_KEYS`): each series lives in a Prometheus server's memory until
  it ages out, and an unbounded label turns a counter into a leak.
- Stability says what a user may build on (Karpenter's levels): see :class:`Stability`.

A few metrics are not gpufleet's own but OpenTelemetry's semantic conventions'
(:class:`Origin`): the RPC and database client durations every OpenTelemetry-aware dashboard
already reads. Their names and attribute keys are the ``opentelemetry-semantic-conventions``
package's constants, never typed here, and their labels come from a second, equally bounded
vocabulary (:data:`SEMCONV_LABELS`) whose keys are the convention's dotted ones.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from functools import cached_property

from opentelemetry.semconv._incubating.attributes import db_attributes as incubating_db_attributes
from opentelemetry.semconv._incubating.attributes import rpc_attributes
from opentelemetry.semconv._incubating.metrics import rpc_metrics
from opentelemetry.semconv.attributes import (
    client_attributes,
    db_attributes,
    error_attributes,
    network_attributes,
    server_attributes,
)
from opentelemetry.semconv.metrics import db_metrics

__all__ = [
    "CATALOGUE",
    "FORBIDDEN_LABEL_KEYS",
    "LABELS",
    "SEMCONV_LABELS",
    "SEMCONV_METRIC_NAMES",
    "Instrument",
    "Label",
    "Metric",
    "Origin",
    "Stability",
    "by_name",
    "prometheus_name",
]


class Instrument(enum.StrEnum):
    """The OpenTelemetry instrument a metric is recorded with."""

    # Only goes up (events); Prometheus: a counter, ``_total``.
    COUNTER = "counter"
    # Goes up and down as things come and go; Prometheus: a gauge.
    UP_DOWN_COUNTER = "up-down counter"
    # A distribution (durations); Prometheus: ``_bucket``, ``_sum``, ``_count``.
    HISTOGRAM = "histogram"
    # Read when the metrics are collected, from state the process already holds;
    # Prometheus: a gauge.
    OBSERVABLE_GAUGE = "observable gauge"


class Stability(enum.StrEnum):
    """What a user may build on a metric (Karpenter's levels).

    - ``stable``: name, unit, labels and meaning are kept; a change ships the old and the
      new side by side for a release, and says so in the changelog.
    - ``beta``: the meaning is kept; the name or the labels may still change, said in the
      changelog.
    - ``alpha``: new, and may change or go without notice.
    """

    STABLE = "stable"
    BETA = "beta"
    ALPHA = "alpha"


class Origin(enum.StrEnum):
    """Who defines a metric's name, unit, labels and meaning."""

    # gpufleet's own: ``gpufleet.<area>.<thing>``, labels from :data:`LABELS`.
    GPUFLEET = "gpufleet"
    # OpenTelemetry's semantic conventions: the name, the unit and the attribute keys are
    # the convention's (the package's constants), labels from :data:`SEMCONV_LABELS`.
    SEMCONV = "semconv"


@dataclass(frozen=True)
class Label:
    """A label key and what keeps its values few (shown in the reference)."""

    key: str
    bound: str

    @property
    def prometheus_key(self) -> str:
        """The label's name in Prometheus: the exporter turns every character a Prometheus
        label may not hold into ``_`` (a convention's ``rpc.method`` is ``rpc_method``)."""
        return re.sub(r"[^a-zA-Z0-9_]", "_", self.key)


# Keys that no metric may carry, whatever the vocabulary says: each names one of a number
# of things that grows with use (every job, every machine ever rented, every tenant), and a
# label's every value is a series kept in the metrics server's memory. A tenant's free text
# (``tenant_values``) is not even bounded in size. Found by a test as well.
FORBIDDEN_LABEL_KEYS = frozenset(
    {
        "job",
        "job_id",
        "attempt",
        "attempt_id",
        "machine",
        "machine_id",
        "instance_id",
        "provider_instance_id",
        "workspace",
        "workspace_id",
        "request_id",
        "tenant_values",
        "trace_id",
        "caller",
        "peer",
        # The conventions' own addresses and texts: the peer's or the server's address and
        # port (as many as there are machines and connections), a method name a client made
        # up, a statement's text.
        server_attributes.SERVER_ADDRESS,
        server_attributes.SERVER_PORT,
        client_attributes.CLIENT_ADDRESS,
        client_attributes.CLIENT_PORT,
        network_attributes.NETWORK_PEER_ADDRESS,
        network_attributes.NETWORK_PEER_PORT,
        rpc_attributes.RPC_METHOD_ORIGINAL,
        db_attributes.DB_QUERY_TEXT,
        incubating_db_attributes.DB_STATEMENT,
    }
)


# The vocabulary: the only label keys a metric may name. Keys in snake case, as Prometheus
# shows them (OpenTelemetry's dots would become underscores anyway).
POOL = Label("pool", "a pool of the catalogue (operator-defined, a handful); `none` for a machine in no pool")
PROVIDER = Label(
    "provider",
    "a provider driver: `AWS`, `GCP`, `LOCAL`, `SIM`; `unknown` for a quarantine whose offering left "
    "the catalogue; `PROVISIONER` for a listing that failed at the provisioner itself",
)
REGION = Label("region", "a region named by an offering of the catalogue; `unlisted` for any other")
OFFERING = Label("offering", "an offering of the catalogue; `unlisted` for any other")
KIND = Label("kind", "a job kind of the catalogue (counted only once the catalogue check has passed)")
PLAN_TIER = Label("plan_tier", "a plan's tier number (a handful)")
NET = Label(
    "net",
    "a watchdog by name: a reaper net, a sweeper pass, a scheduler request watchdog, the incident "
    "webhook (`incident_webhook`)",
)
GATE = Label("gate", "the gate that refused: a `RefusalReason` value")
ACTION = Label(
    "action", "what a net did: a word fixed in its code (`mark_lost`, `stop`, `probe_failed`, ...)"
)
FAILURE_CLASS = Label("failure_class", "a failure ledger class (`FailureClass`)")
OUTCOME = Label("outcome", "how something ended: a fixed set per metric, listed in its meaning")
STATE = Label("state", "a machine state (`MachineState`, DESTROYED excluded)")
PHASE = Label(
    "phase",
    "a fleet tick phase: `snapshot`, `connect`, `decide`, `limits`, `films`, `pools`, `scale`, "
    "`assign`, `follow_up`",
)
OPERATION = Label(
    "operation", "a provider driver operation: `create`, `start`, `stop`, `destroy`, `get`, `list`"
)
RESULT = Label("result", "`OK`, or the typed provider error's kind (`NOT_FOUND`, `QUOTA_EXCEEDED`, ...)")
METHOD = Label(
    "method",
    "a gRPC method the server serves (`/gpufleet.v1.JobService/SubmitJob`); a call to an unknown "
    "method never reaches the check",
)
REASON = Label("reason", "an authorization verdict: `unauthenticated`, `no_rule`, `wrong_role`")
CAUSE = Label("cause", "why a dispatch failed: a `DispatchFailure` value")
SLOT_STATE = Label("slot_state", "`free` or `busy`")
FILM_STATE = Label(
    "film_state", "`earmarked` (held for a film's next job) or `draining` (taking no new work for one)"
)
LEASE = Label("lease", "a leader lease: one per timer-driven service (`scheduler`, `reaper`, `sweeper`)")
QUARANTINE_KIND = Label("quarantine_kind", "what is quarantined: `OFFERING` or `PROVIDER_REGION`")
SEVERITY = Label("severity", "a GPU finding's severity: `warning` or `critical`")
FINDING = Label(
    "finding",
    "what a GPU health finding is: `xid`, `ecc_uncorrectable`, `ecc_correctable`, `retired_pages_pending`, "
    "`row_remap_pending`, `row_remap_failure`, `gpu_lost`, `init_failed`; `other` for any other",
)

LABELS: dict[str, Label] = {
    label.key: label
    for label in (
        POOL,
        PROVIDER,
        REGION,
        OFFERING,
        KIND,
        PLAN_TIER,
        NET,
        GATE,
        ACTION,
        FAILURE_CLASS,
        OUTCOME,
        STATE,
        PHASE,
        OPERATION,
        RESULT,
        METHOD,
        REASON,
        CAUSE,
        SLOT_STATE,
        FILM_STATE,
        LEASE,
        QUARANTINE_KIND,
        SEVERITY,
        FINDING,
    )
}

# -- the semantic conventions' vocabulary ------------------------------------------------------
# The attribute keys of the semantic-convention metrics gpufleet records, as the installed
# package spells them today (rpc.system.name, rpc.response.status_code: the package marks
# rpc.system, rpc.service and rpc.grpc.status_code deprecated; a unit test fails when it
# deprecates one of these). Addresses, ports and texts stay out (FORBIDDEN_LABEL_KEYS).
RPC_SYSTEM_NAME = Label(rpc_attributes.RPC_SYSTEM_NAME, "`grpc`")
RPC_METHOD = Label(
    rpc_attributes.RPC_METHOD,
    "a gRPC method, fully qualified (`gpufleet.v1.JobService/SubmitJob`): on a server one it "
    "serves (health and reflection included), `_OTHER` for any other name a caller sent; on a "
    "client one of the generated stubs gpufleet calls through",
)
RPC_RESPONSE_STATUS_CODE = Label(
    rpc_attributes.RPC_RESPONSE_STATUS_CODE, "a gRPC status code's name: `OK`, `NOT_FOUND`, ... (17)"
)
ERROR_TYPE = Label(
    error_attributes.ERROR_TYPE,
    "set only on a failure. RPC: the status code's name (a server counts as its failures only "
    "`UNKNOWN`, `DEADLINE_EXCEEDED`, `UNIMPLEMENTED`, `INTERNAL`, `UNAVAILABLE`, `DATA_LOSS`; a "
    "client every code but `OK`), or the exception's class when a call failed before any "
    "status. Database: the SQLSTATE (PostgreSQL) or SQLite's error name, else the driver "
    "exception's class",
)
DB_SYSTEM_NAME = Label(db_attributes.DB_SYSTEM_NAME, "`postgresql` or `sqlite`")
DB_OPERATION_NAME = Label(
    db_attributes.DB_OPERATION_NAME,
    "the SQL verb of a statement SQLAlchemy built: `SELECT`, `INSERT`, `UPDATE`, `DELETE`, with "
    "`BATCH ` before it for one run with several parameter sets (executemany); `COPY` for a bulk "
    "insert's COPY; for a statement run around SQLAlchemy, the verb its code gives it. Not set for "
    "DDL or text SQL given none, whose verb would have to be read from the text; never the "
    "statement's text",
)
DB_RESPONSE_STATUS_CODE = Label(
    db_attributes.DB_RESPONSE_STATUS_CODE,
    "set only on a failure the database answered: its SQLSTATE (`40001`, `23505`, ...) or "
    "SQLite's error name (`SQLITE_BUSY`)",
)

SEMCONV_LABELS: dict[str, Label] = {
    label.key: label
    for label in (
        RPC_SYSTEM_NAME,
        RPC_METHOD,
        RPC_RESPONSE_STATUS_CODE,
        ERROR_TYPE,
        DB_SYSTEM_NAME,
        DB_OPERATION_NAME,
        DB_RESPONSE_STATUS_CODE,
    )
}
# The semantic-convention metrics gpufleet may declare: the package's names for them.
SEMCONV_METRIC_NAMES = frozenset(
    {
        rpc_metrics.RPC_SERVER_CALL_DURATION,
        rpc_metrics.RPC_CLIENT_CALL_DURATION,
        db_metrics.DB_CLIENT_OPERATION_DURATION,
    }
)

_NAME = re.compile(r"^gpufleet(\.[a-z][a-z0-9_]*)+$")


@dataclass(frozen=True)
class Metric:
    """One metric: everything an instrument is created from and the reference shows."""

    name: str
    instrument: Instrument
    unit: str
    labels: tuple[Label, ...]
    description: str
    stability: Stability
    # A histogram's bucket boundaries, in its unit. OpenTelemetry's default ones
    # (0, 5, 10, ... 10 000) are made for milliseconds and would put every duration in
    # seconds into the first two buckets.
    buckets: tuple[float, ...] = ()
    origin: Origin = Origin.GPUFLEET

    def __post_init__(self) -> None:
        if self.origin is Origin.SEMCONV:
            if self.name not in SEMCONV_METRIC_NAMES:
                raise ValueError(f"{self.name}: not a semantic-convention metric gpufleet records")
        elif not _NAME.match(self.name):
            raise ValueError(f"{self.name}: a metric name is gpufleet.<area>.<thing>, lower case")
        if not self.unit:
            raise ValueError(f"{self.name}: a unit is required (UCUM; a count is {{thing}})")
        keys = [label.key for label in self.labels]
        if len(set(keys)) != len(keys):
            raise ValueError(f"{self.name}: a label is listed twice")
        vocabulary = self.vocabulary
        for label in self.labels:
            if vocabulary.get(label.key) != label or label.key in FORBIDDEN_LABEL_KEYS:
                raise ValueError(f"{self.name}: label {label.key!r} is not in the vocabulary")
        if (self.instrument is Instrument.HISTOGRAM) != bool(self.buckets):
            raise ValueError(f"{self.name}: buckets are given for a histogram, and only for one")
        if list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"{self.name}: bucket boundaries must increase")

    @property
    def vocabulary(self) -> dict[str, Label]:
        """The labels this metric may draw from: gpufleet's, or the conventions'."""
        return SEMCONV_LABELS if self.origin is Origin.SEMCONV else LABELS

    @cached_property
    def label_keys(self) -> frozenset[str]:
        return frozenset(label.key for label in self.labels)

    @property
    def prometheus_name(self) -> str:
        return prometheus_name(self.name, self.unit, self.instrument)


# -- OpenTelemetry's conversion to Prometheus names -----------------------------------------
# As the specification's "Prometheus and OpenMetrics Compatibility" section and the
# OpenTelemetry Prometheus exporter do it (the exporter's table is copied from the
# collector's normalize_name.go); a unit test checks these names against that exporter.
_UNIT_WORDS = {
    "d": "days",
    "h": "hours",
    "min": "minutes",
    "s": "seconds",
    "ms": "milliseconds",
    "us": "microseconds",
    "ns": "nanoseconds",
    "By": "bytes",
    "KiBy": "kibibytes",
    "MiBy": "mebibytes",
    "GiBy": "gibibytes",
    "m": "meters",
    "V": "volts",
    "A": "amperes",
    "J": "joules",
    "W": "watts",
    "g": "grams",
    "Cel": "celsius",
    "Hz": "hertz",
    # The specification says "ratio" (for gauges); the Python exporter writes nothing yet.
    "1": "",
    "%": "percent",
}
_PER_UNIT_WORDS = {
    "s": "second",
    "m": "minute",
    "h": "hour",
    "d": "day",
    "w": "week",
    "mo": "month",
    "y": "year",
}
_INVALID = re.compile(r"[^a-zA-Z0-9:]+")


def _unit_word(unit: str) -> str:
    unit = re.sub(r"{.*}", "", unit)  # an annotation ({machine}) adds no suffix
    if unit in _UNIT_WORDS:
        return _UNIT_WORDS[unit]
    top, slash, bottom = unit.partition("/")
    if slash and _INVALID.sub("_", bottom):
        top = _UNIT_WORDS.get(_INVALID.sub("_", top), _INVALID.sub("_", top))
        per = _PER_UNIT_WORDS.get(_INVALID.sub("_", bottom), _INVALID.sub("_", bottom))
        return f"{top}_per_{per}" if top else f"per_{per}"
    return _INVALID.sub("_", unit).strip("_")


def prometheus_name(name: str, unit: str, instrument: Instrument) -> str:
    """The name a Prometheus server stores an OpenTelemetry metric under: invalid
    characters (the dots) to ``_``, the unit's word appended unless already there, and
    ``_total`` for a counter (an up-down counter and a gauge are Prometheus gauges). A
    histogram is then queried as ``<name>_bucket``, ``<name>_sum`` and ``<name>_count``."""
    base = _INVALID.sub("_", name)
    counter = instrument is Instrument.COUNTER
    if counter and base.endswith("_total"):
        base = base[: -len("_total")]
    word = _unit_word(unit)
    if word and not base.endswith(f"_{word}"):
        base = f"{base}_{word}"
    return f"{base}_total" if counter else base


# -- the catalogue ---------------------------------------------------------------------------
# Phases, durations in seconds: a tick's phase takes from well under a millisecond (decide
# on a small fleet) to seconds (the assign step of a 10k-job burst).
_TICK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A provider call: a get in tens of milliseconds, a create 30-60 s at a busy cloud, and the
# provider call timeout beyond.
_PROVIDER_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# -- the nets
REAPER_REFUSALS = Metric(
    name="gpufleet.reaper.refusals",
    instrument=Instrument.COUNTER,
    unit="{refusal}",
    labels=(NET, GATE),
    description="Times a reaper net looked at a machine and did not act, by net and by the gate that "
    "said no. Each refusal is also a span event and a log line naming the machine.",
    stability=Stability.BETA,
)
REAPER_ACTIONS = Metric(
    name="gpufleet.reaper.actions",
    instrument=Instrument.COUNTER,
    unit="{action}",
    labels=(NET, ACTION),
    description="What the reaper's nets did, by net and action: a machine marked lost or reachable "
    "again, a stop or destroy issued or failed, an idle timer cleared, a probe's answer.",
    stability=Stability.BETA,
)

# -- the clouds
PROVIDER_CALLS = Metric(
    name="gpufleet.provider.calls",
    instrument=Instrument.COUNTER,
    unit="{call}",
    labels=(PROVIDER, OPERATION, RESULT),
    description="Calls the provisioner made to a cloud's API, by provider, operation and result: a "
    "stockout wave is result=INSUFFICIENT_CAPACITY on create, lost credentials AUTH_FAILED.",
    stability=Stability.BETA,
)
PROVIDER_CALL_DURATION = Metric(
    name="gpufleet.provider.call.duration",
    instrument=Instrument.HISTOGRAM,
    unit="s",
    labels=(PROVIDER, OPERATION, RESULT),
    description="How long each call to a cloud's API took, failed ones included (a create that waits "
    "for the instance counts its wait).",
    stability=Stability.ALPHA,
    buckets=_PROVIDER_BUCKETS,
)

# -- the walls
AUTH_REFUSALS = Metric(
    name="gpufleet.auth.refusals",
    instrument=Instrument.COUNTER,
    unit="{call}",
    labels=(METHOD, REASON),
    description="Calls a gpufleet server refused by its authorization table, by method and reason "
    "(each is also logged with the caller and the peer). Not counted on a server run insecure.",
    stability=Stability.BETA,
)

# -- the scheduler
JOBS_SUBMITTED = Metric(
    name="gpufleet.jobs.submitted",
    instrument=Instrument.COUNTER,
    unit="{job}",
    labels=(POOL, KIND),
    description="Jobs SubmitJob accepted (new ones: a repeated request_id is not counted again), by "
    "pool and kind. Not by workspace: workspaces are unbounded in number.",
    stability=Stability.BETA,
)
JOBS_STARTED = Metric(
    name="gpufleet.jobs.started",
    instrument=Instrument.COUNTER,
    unit="{job}",
    labels=(KIND,),
    description="Job attempts that started on their machine (the agent accepted StartJob and the "
    "scheduler recorded it RUNNING), by kind; a retried job counts once per attempt.",
    stability=Stability.ALPHA,
)
SCHEDULER_TICK_PHASE_DURATION = Metric(
    name="gpufleet.scheduler.tick.phase.duration",
    instrument=Instrument.HISTOGRAM,
    unit="s",
    labels=(PHASE,),
    description="Wall time of each phase of the leader's fleet tick; the phases' sum is the tick. "
    "No phase waits on a network call, so a slow one means the database or the decision.",
    stability=Stability.ALPHA,
    buckets=_TICK_BUCKETS,
)
SCHEDULER_ASSIGNMENTS = Metric(
    name="gpufleet.scheduler.assignments",
    instrument=Instrument.COUNTER,
    unit="{assignment}",
    labels=(POOL,),
    description="Jobs the fleet tick assigned to a machine's slots and committed, by the machine's "
    "pool (a planned assignment found stale at commit is not counted).",
    stability=Stability.ALPHA,
)
SCHEDULER_DISPATCH_FAILURES = Metric(
    name="gpufleet.scheduler.dispatch.failures",
    instrument=Instrument.COUNTER,
    unit="{attempt}",
    labels=(CAUSE,),
    description="Attempts taken back, uncharged, because they could not be started, by cause: "
    "agent_refused, agent_unreachable, agent_timeout (the machine backs off), not_dispatched, "
    "tokens_not_minted (the control plane's own: no back-off).",
    stability=Stability.ALPHA,
)

# -- the fleet
FLEET_MACHINES = Metric(
    name="gpufleet.fleet.machines",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{machine}",
    labels=(STATE, POOL, PROVIDER),
    description="Machines not destroyed, by state, pool and provider, as the scheduler leader's "
    "last fleet tick read them (zero for a state with none). Only the leader reports it, and "
    "stops within three ticks of losing the lease: sum it across replicas.",
    stability=Stability.ALPHA,
)

# Waits, in seconds: a job that starts at once (under a second) to a day's queue.
_WAIT_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)
# From a failure's first sign to a net's act: seconds (a probe) to an hour (a stuck stop).
_DETECTION_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0)
# From a job's assignment to its agent's answer: milliseconds on a quiet fleet, the dispatch
# deadline (30 s) at worst.
_DISPATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# -- money: recorded by the scheduler leader from each fleet tick's snapshot
FLEET_GPU_BILLED = Metric(
    name="gpufleet.fleet.gpu.billed",
    instrument=Instrument.COUNTER,
    unit="s",
    labels=(PROVIDER, POOL),
    description="GPU-seconds the clouds billed: each machine in a billing state (PROVISIONING to "
    "DESTROYING, STOPPED excluded) counts its GPUs times the time between two fleet ticks. "
    "Divide by 3600 for GPU-hours. Counted by the scheduler leader; a new leader starts from 0 and "
    "its first tick books nothing; a gap between ticks is booked up to three tick intervals (a "
    "paused leader does not book its pause).",
    stability=Stability.ALPHA,
)
FLEET_GPU_IDLE = Metric(
    name="gpufleet.fleet.gpu.idle",
    instrument=Instrument.COUNTER,
    unit="s",
    labels=(PROVIDER, POOL),
    description="The part of gpufleet.fleet.gpu.billed on machines with no live attempt (billing, "
    "nothing running or starting on any slot): the waste the nets exist to bound.",
    stability=Stability.ALPHA,
)
FLEET_SPEND_RATE = Metric(
    name="gpufleet.fleet.spend_rate",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{USD}/h",
    labels=(PROVIDER, POOL),
    description="What the machines billing now cost per hour, at the price each was bought at (its "
    "offering's catalogue price then; a self-registered box counts 0), as the scheduler leader's "
    "last fleet tick read them.",
    stability=Stability.ALPHA,
)
FLEET_SLOTS = Metric(
    name="gpufleet.fleet.slots",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{slot}",
    labels=(POOL, SLOT_STATE),
    description="Slots of READY machines, free or busy (holding a live attempt, or an ended one whose "
    "process the machine has not yet reported gone: not given out either way), by pool, as the "
    "scheduler leader's last fleet tick read them.",
    stability=Stability.ALPHA,
)
FLEET_FILM_MACHINES = Metric(
    name="gpufleet.fleet.film.machines",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{machine}",
    labels=(POOL, FILM_STATE),
    description="Machines held for films: earmarked for a film's next job, or draining for one, by "
    "pool, from the scheduler leader's last fleet tick.",
    stability=Stability.ALPHA,
)
FLEET_WARM_MACHINES = Metric(
    name="gpufleet.fleet.warm.machines",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{machine}",
    labels=(POOL,),
    description="Machines a pool holds warm (pinned against auto-stop and auto-destroy), from the "
    "scheduler leader's last fleet tick.",
    stability=Stability.ALPHA,
)

# -- the queue and the jobs
SCHEDULER_QUEUE_JOBS = Metric(
    name="gpufleet.scheduler.queue.jobs",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{job}",
    labels=(KIND, PLAN_TIER),
    description="Jobs waiting for a slot (QUEUED: those in back-off and those of paused workspaces "
    "included), by kind and the workspace's plan tier, counted by the scheduler leader after each "
    "fleet tick.",
    stability=Stability.ALPHA,
)
SCHEDULER_QUEUE_WAIT = Metric(
    name="gpufleet.scheduler.queue.wait",
    instrument=Instrument.HISTOGRAM,
    unit="s",
    labels=(KIND, PLAN_TIER),
    description="How long each attempt waited in the queue before it started: from the job's "
    "submission (a retry: from its requeue) to RUNNING, by kind and plan tier. Not measured for an "
    "attempt re-dispatched by a new leader.",
    stability=Stability.ALPHA,
    buckets=_WAIT_BUCKETS,
)
SCHEDULER_DISPATCH_DURATION = Metric(
    name="gpufleet.scheduler.dispatch.duration",
    instrument=Instrument.HISTOGRAM,
    unit="s",
    labels=(),
    description="From an attempt's assignment commit to the agent's acceptance recorded (RUNNING): "
    "the time a job spends between being given a slot and running on it.",
    stability=Stability.ALPHA,
    buckets=_DISPATCH_BUCKETS,
)
SCHEDULER_FAIR_SHARE_USAGE = Metric(
    name="gpufleet.scheduler.fair_share.usage",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="s",
    labels=(PLAN_TIER,),
    description="Slot-seconds used over the fair-share window (24 h) by the workspaces of each plan "
    "tier: the usage the fleet tick's fair share orders the queue by.",
    stability=Stability.ALPHA,
)
# A plan allows each of its workspaces a number of GPU jobs at once (``max_gpu_jobs``); the
# fleet tick's demand step leaves a workspace's queued jobs beyond that out, and records
# PLAN_CONCURRENCY_LIMIT for them. These three say, per tier, how much of the waiting is the
# plans' doing rather than the fleet's.
SCHEDULER_PLAN_CAP_HELD_JOBS = Metric(
    name="gpufleet.scheduler.plan_cap.held_jobs",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{job}",
    labels=(PLAN_TIER,),
    description="Queued jobs their workspace's plan cap holds back, by plan tier: of each workspace's "
    "QUEUED jobs that could start now (workspace not paused, back-off over), those beyond the room its "
    "plan leaves (GPU jobs at once less its live ones) — the jobs the fleet tick gives "
    "PLAN_CONCURRENCY_LIMIT (QUEUE_WAIT_DEADLINE_NEAR naming it, near their deadline), all of them, "
    "not only those a tick reads. Above 0 for long, the plan and not the fleet is what keeps that "
    "tier waiting: more machines will not start these jobs, a bigger plan would. Counted by the "
    "scheduler leader after each fleet tick.",
    stability=Stability.ALPHA,
)
SCHEDULER_PLAN_CAP_WORKSPACES_AT_CAP = Metric(
    name="gpufleet.scheduler.plan_cap.workspaces_at_cap",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{workspace}",
    labels=(PLAN_TIER,),
    description="Workspaces running as many GPU jobs as their plan allows at once (or more, after a "
    "cap was lowered), by plan tier: the next job each submits waits for one of its own to end, "
    "whatever the fleet has free. A plan allowing none counts a workspace only while it has a job "
    "that could start. Counted by the scheduler leader after each fleet tick, its assignments "
    "included.",
    stability=Stability.ALPHA,
)
SCHEDULER_PLAN_CAP_RUNNING_JOBS = Metric(
    name="gpufleet.scheduler.plan_cap.running_jobs",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{job}",
    labels=(PLAN_TIER,),
    description="GPU jobs live (an attempt STARTING or RUNNING) by plan tier, as the plans' caps count "
    "them: beside gpufleet.scheduler.plan_cap.workspaces_at_cap, how much of each tier's use is "
    "pressed against its cap. From the scheduler leader's last fleet tick, its assignments included.",
    stability=Stability.ALPHA,
)
JOBS_FINISHED = Metric(
    name="gpufleet.jobs.finished",
    instrument=Instrument.COUNTER,
    unit="{job}",
    labels=(KIND, OUTCOME),
    description="Jobs that reached a final state, by kind and outcome: SUCCEEDED, FAILED, "
    "CANCELLED, TIMED_OUT; counted once, when the write that ended the job committed, by whichever "
    "service wrote it: the scheduler (a worker's report, a cancel, a time limit, a lease run out "
    "that spent the lost-retry budget, the queue-wait timeout and no-consumer watchdogs), the "
    "reaper or the sweeper (a machine replaced whose loss spent a job's lost-retry budget, or "
    "whose job had been asked to cancel).",
    stability=Stability.ALPHA,
)
JOBS_RETRIED = Metric(
    name="gpufleet.jobs.retried",
    instrument=Instrument.COUNTER,
    unit="{attempt}",
    labels=(KIND, FAILURE_CLASS),
    description="Attempts whose job went back to the queue for another one, by kind and the failure "
    "that ended the attempt: job_failed or job_infra_error (the worker's report, a dispatch taken "
    "back), lease_expired (the scheduler lost the attempt's lease), or the ledger class that "
    "replaced its machine (went_silent, boot_failed, preempted, instance_gone, ...: a reaper net "
    "or the sweeper). A stuck dispatch sent back to the queue ended no attempt and is not counted.",
    stability=Stability.ALPHA,
)
ATTEMPTS_LOST = Metric(
    name="gpufleet.attempts.lost",
    instrument=Instrument.COUNTER,
    unit="{attempt}",
    labels=(KIND,),
    description="Attempts ended LOST, by kind: their lease ran out (nothing heard from the worker: "
    "the scheduler) or their machine was replaced (went silent, failed its boot, pre-empted, gone "
    "at the provider: a reaper net or the sweeper), counted once that write committed. Our "
    "failure, never charged.",
    stability=Stability.ALPHA,
)

# -- the nets (reaper) and the sweeper
REAPER_DETECTION_LATENCY = Metric(
    name="gpufleet.reaper.detection.latency",
    instrument=Instrument.HISTOGRAM,
    unit="s",
    labels=(NET,),
    description="For each act of a net (a machine marked lost, stopped, destroyed, replaced), the time "
    "from the failure's first sign (the last heartbeat, the deadline's start, idle since, the "
    "transition's start, a GPU fault's first ledger row; for a machine the sweeper finds lost at the "
    "provider, the last listing that showed it running) to the act; each net's sign is listed in "
    "services/reaper/gpufleet/reaper/detection_latency.py.",
    stability=Stability.ALPHA,
    buckets=_DETECTION_BUCKETS,
)
REAPER_IDLE_TIMERS = Metric(
    name="gpufleet.reaper.idle.timers",
    instrument=Instrument.COUNTER,
    unit="{machine}",
    labels=(ACTION,),
    description="The idle chain's timers, one per machine for its stop and destroy timers together: "
    "`armed` when the reaper's idle scanner first sees the machine idle; `cleared` when timers that "
    "were set are taken off — traffic the scanner sees, work the scheduler assigns to the machine, "
    "or the scheduler starting it again after a stop (its destroy timer). An armed machine's chain "
    "ends `cleared` or in auto_destroy's destroy (gpufleet.reaper.actions), so armed - cleared - "
    "those destroys is the chains still running, less any ended by another net's destroy or a "
    "machine lost at the provider, which are not counted here.",
    stability=Stability.ALPHA,
)
SWEEPER_ORPHANS = Metric(
    name="gpufleet.sweeper.orphans",
    instrument=Instrument.COUNTER,
    unit="{instance}",
    labels=(PROVIDER, OUTCOME),
    description="Cloud instances with gpufleet's tag and no live machine record, by provider and "
    "outcome: `found`, `destroyed`, `refused` (a gate said no, e.g. too young to be sure).",
    stability=Stability.ALPHA,
)
SWEEPER_LISTING_FAILURES = Metric(
    name="gpufleet.sweeper.listing.failures",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{listing}",
    labels=(PROVIDER,),
    description="Consecutive failed listings of a provider's instances (0 when the last one "
    "succeeded): while it is above 0 neither orphans nor lost instances are found there. "
    "provider=PROVISIONER counts the rounds the provisioner itself could not be reached.",
    stability=Stability.ALPHA,
)
WATCHDOG_LAST_RUN = Metric(
    name="gpufleet.watchdog.last_run",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="s",
    labels=(NET,),
    description="When each watchdog (a reaper net, the sweeper's passes, the scheduler's request "
    "watchdogs, the incident webhook's cursor) last completed a pass, as Unix seconds of the "
    "system's clock; `time() - this` is its silence (under `gpufleet up --speed N` the system's "
    "clock runs ahead of Prometheus', and the silence reads negative).",
    stability=Stability.ALPHA,
)
WATCHDOG_CADENCE = Metric(
    name="gpufleet.watchdog.cadence",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="s",
    labels=(NET,),
    description="How often each watchdog is meant to run: an alert fires when one has not run for "
    "three of these.",
    stability=Stability.ALPHA,
)
LEADER_LEADING = Metric(
    name="gpufleet.leader.leading",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="1",
    labels=(LEASE,),
    description="1 while this process holds the lease (leads its service's timers), 0 while it "
    "stands by. `sum by (lease)` is 1 in a healthy deployment, 0 with no leader.",
    stability=Stability.BETA,
)

# -- the clouds, the ledger, incidents
PROVIDER_STOCKOUTS = Metric(
    name="gpufleet.provider.stockouts",
    instrument=Instrument.COUNTER,
    unit="{call}",
    labels=(PROVIDER, REGION, OFFERING),
    description="Creates a cloud refused for want of capacity (INSUFFICIENT_CAPACITY), by provider, "
    "region and offering.",
    stability=Stability.ALPHA,
)
QUARANTINES_ACTIVE = Metric(
    name="gpufleet.quarantines.active",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{quarantine}",
    labels=(QUARANTINE_KIND, PROVIDER),
    description="Quarantines in force (neither cleared nor expired): offerings the scheduler will not "
    "create, and provider regions halted, by provider.",
    stability=Stability.ALPHA,
)
INCIDENTS_OPEN = Metric(
    name="gpufleet.incidents.open",
    instrument=Instrument.OBSERVABLE_GAUGE,
    unit="{incident}",
    labels=(FAILURE_CLASS,),
    description="Incidents open and not yet acknowledged, by failure class: each waits for a "
    "human (acknowledging one, `gpufleet incidents ack ID`, says a person has it; a resolved one "
    "is over). The alert `GpufleetIncidentOpen` fires on it.",
    stability=Stability.BETA,
)
INCIDENT_NOTIFICATIONS = Metric(
    name="gpufleet.incidents.notifications",
    instrument=Instrument.COUNTER,
    unit="{notification}",
    labels=(OUTCOME,),
    description="Incident webhook posts, by outcome: `sent`, `failed` (retries spent), `dropped` "
    "(the queue was full).",
    stability=Stability.ALPHA,
)
LEDGER_FAILURES = Metric(
    name="gpufleet.ledger.failures",
    instrument=Instrument.COUNTER,
    unit="{failure}",
    labels=(FAILURE_CLASS, OUTCOME),
    description="Rows written to the failure ledger, by class and the outcome it routed to "
    "(`LedgerOutcome`: NOTHING, REPLACE_MACHINE, HALT_PROVISIONING, ALERT_HUMAN, ...), counted "
    "when the row's transaction commits.",
    stability=Stability.BETA,
)

GPU_FINDINGS = Metric(
    name="gpufleet.gpu.findings",
    instrument=Instrument.COUNTER,
    unit="{finding}",
    labels=(SEVERITY, FINDING),
    description="GPU health findings the machines' heartbeats reported for the first time (an Xid, an "
    "ECC count past its threshold, a row remap failure, a lost GPU, a failed initialisation, ...), by "
    "severity and kind. A critical one also cordons its machine and writes a `gpu_fault` ledger row; a "
    "warning is only counted and logged.",
    stability=Stability.ALPHA,
)

# -- OpenTelemetry's semantic conventions: gRPC and the database -----------------------------
# No instrumentation library records these for gpufleet's stack (gpufleet.common.rpc_durations
# and gpufleet.common.db.operation_durations say why); gpufleet records them itself, as the
# conventions define them.
# Bucket boundaries are the conventions' own advice (ExplicitBucketBoundaries).
_RPC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
_DB_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)

RPC_SERVER_CALL_DURATION = Metric(
    name=rpc_metrics.RPC_SERVER_CALL_DURATION,
    instrument=Instrument.HISTOGRAM,
    unit="s",
    labels=(RPC_SYSTEM_NAME, RPC_METHOD, RPC_RESPONSE_STATUS_CODE, ERROR_TYPE),
    description="How long each gRPC call a gpufleet server answered took, from reaching the server's "
    "first interceptor to its status, by method and status code: calls refused by the authorization "
    "table or naming no method the server serves included. A server stream counts from its start "
    "to its end.",
    stability=Stability.BETA,
    buckets=_RPC_BUCKETS,
    origin=Origin.SEMCONV,
)
RPC_CLIENT_CALL_DURATION = Metric(
    name=rpc_metrics.RPC_CLIENT_CALL_DURATION,
    instrument=Instrument.HISTOGRAM,
    unit="s",
    labels=(RPC_SYSTEM_NAME, RPC_METHOD, RPC_RESPONSE_STATUS_CODE, ERROR_TYPE),
    description="How long each gRPC call a gpufleet client made took, until its status, by method and "
    "status code; each retry is a call of its own. Not by server: an agent's address is one of as "
    "many as there are machines.",
    stability=Stability.BETA,
    buckets=_RPC_BUCKETS,
    origin=Origin.SEMCONV,
)
DB_CLIENT_OPERATION_DURATION = Metric(
    name=db_metrics.DB_CLIENT_OPERATION_DURATION,
    instrument=Instrument.HISTOGRAM,
    unit="s",
    labels=(DB_SYSTEM_NAME, DB_OPERATION_NAME, DB_RESPONSE_STATUS_CODE, ERROR_TYPE),
    description="How long each SQL statement gpufleet ran took at the driver, until the driver had its "
    "result, by database and operation; a failed one carries its error. Those run through "
    "SQLAlchemy are timed from its engine's events; those that go around it are timed where they "
    "run, the same way: SubmitJob's writes (db.statements: StatementPool, SqliteWriter; not their "
    "transaction's BEGIN and COMMIT on SQLite) and the COPY of bulk inserts (from its start to the "
    "server's answer).",
    stability=Stability.STABLE,
    buckets=_DB_BUCKETS,
    origin=Origin.SEMCONV,
)

CATALOGUE: tuple[Metric, ...] = (
    FLEET_MACHINES,
    FLEET_GPU_BILLED,
    FLEET_GPU_IDLE,
    FLEET_SPEND_RATE,
    FLEET_SLOTS,
    FLEET_FILM_MACHINES,
    FLEET_WARM_MACHINES,
    SCHEDULER_QUEUE_JOBS,
    SCHEDULER_QUEUE_WAIT,
    SCHEDULER_DISPATCH_DURATION,
    SCHEDULER_FAIR_SHARE_USAGE,
    SCHEDULER_PLAN_CAP_HELD_JOBS,
    SCHEDULER_PLAN_CAP_WORKSPACES_AT_CAP,
    SCHEDULER_PLAN_CAP_RUNNING_JOBS,
    JOBS_FINISHED,
    JOBS_RETRIED,
    ATTEMPTS_LOST,
    REAPER_DETECTION_LATENCY,
    REAPER_IDLE_TIMERS,
    SWEEPER_ORPHANS,
    SWEEPER_LISTING_FAILURES,
    WATCHDOG_LAST_RUN,
    WATCHDOG_CADENCE,
    LEADER_LEADING,
    PROVIDER_STOCKOUTS,
    QUARANTINES_ACTIVE,
    INCIDENTS_OPEN,
    INCIDENT_NOTIFICATIONS,
    LEDGER_FAILURES,
    GPU_FINDINGS,
    SCHEDULER_TICK_PHASE_DURATION,
    SCHEDULER_ASSIGNMENTS,
    SCHEDULER_DISPATCH_FAILURES,
    JOBS_SUBMITTED,
    JOBS_STARTED,
    REAPER_REFUSALS,
    REAPER_ACTIONS,
    PROVIDER_CALLS,
    PROVIDER_CALL_DURATION,
    AUTH_REFUSALS,
    RPC_SERVER_CALL_DURATION,
    RPC_CLIENT_CALL_DURATION,
    DB_CLIENT_OPERATION_DURATION,
)


def _index(metrics: tuple[Metric, ...]) -> dict[str, Metric]:
    index: dict[str, Metric] = {}
    prometheus: dict[str, str] = {}
    for metric in metrics:
        if metric.name in index:
            raise ValueError(f"{metric.name} is declared twice")
        clash = prometheus.get(metric.prometheus_name)
        if clash is not None:
            raise ValueError(f"{metric.name} and {clash} have the same Prometheus name")
        index[metric.name] = metric
        prometheus[metric.prometheus_name] = metric.name
    return index


_BY_NAME = _index(CATALOGUE)


def by_name(name: str) -> Metric:
    """The catalogue's metric called ``name`` (KeyError when there is none)."""
    return _BY_NAME[name]
