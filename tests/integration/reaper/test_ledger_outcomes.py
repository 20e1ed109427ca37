"""The failure ledger's routing table and its outcomes, on both stores: every class routes
as DESIGN §5 says, an unknown class alerts a human (never a retry), and each outcome
takes effect where the scheduler's scale step will see it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.enums import LedgerOutcome
from gpufleet.common.db.models import (
    Attempt,
    Incident,
    Job,
    JobKind,
    Machine,
    Offering,
    Plan,
    Pool,
    Quarantine,
    Workspace,
)
from gpufleet.common.ledger import (
    FailureClass,
    OutcomePolicy,
    OutcomeTarget,
    apply_outcome,
    record_failure,
    route,
)
from gpufleet.scheduler.tick.decide import decide as plan_fleet
from gpufleet.scheduler.tick.model import CreateMachine, Policy
from gpufleet.scheduler.tick.snapshot import load_snapshot
from tests.support.fleet_rows import add_attempt, add_machine

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

# DESIGN §5, written out by hand: what each starting class must route to.
EXPECTED = {
    "provision_timeout": "REPLACE_MACHINE",
    "boot_failed": "REPLACE_MACHINE",
    "went_silent": "REPLACE_MACHINE",
    "preempted": "REPLACE_MACHINE",
    # The cloud stopped a spot machine: its work is replaced, the machine kept stopped.
    "spot_stopped": "REPLACE_MACHINE",
    "spot_restarted": "NOTHING",
    # The clouds' list races: a record, nothing moves.
    "not_yet_listed": "NOTHING",
    "destroy_unconfirmed": "NOTHING",
    "gpu_fault": "REPLACE_MACHINE",
    "gpu_fault_repeated": "STOP_HARDWARE_CONFIG",
    "gpu_fault_destroyed": "NOTHING",
    "gpu_fault_destroy_refused": "NOTHING",
    "machine_lost": "NOTHING",
    "instance_gone": "REPLACE_MACHINE",
    # The dead-man switch halted an idle machine: whatever was thought to run there is ended.
    "machine_stopped_itself": "REPLACE_MACHINE",
    "queue_wait_timeout": "FAIL_JOB",
    "no_consumer": "FAIL_JOB",
    "dispatch_stuck": "NOTHING",
    "paid_wait": "ALERT_HUMAN",
    "pool_idle_release": "NOTHING",
    "orphan_found": "NOTHING",
    "lease_expired": "RETRY_SAME_MACHINE",
    "stockout": "STOP_HARDWARE_CONFIG",
    "quota_exceeded": "HALT_PROVISIONING",
    "auth_failed": "HALT_PROVISIONING",
    "provider_call_failed": "ALERT_HUMAN",
    "provider_not_served": "HALT_PROVISIONING",
    "transition_stuck": "ALERT_HUMAN",
    "transition_reissued": "NOTHING",
    "slot_could_not_be_closed": "RETRY_SAME_MACHINE",
    "job_infra_error": "RETRY_SAME_MACHINE",
    "job_failed": "RETRY_SAME_MACHINE",
    "job_timed_out": "FAIL_JOB",
}


@pytest.fixture
def sessions(db_url: str) -> sessionmaker[Session]:
    return make_sessionmaker(make_engine(db_url))


def test_the_table_covers_every_class_and_only_them() -> None:
    assert {c.value for c in FailureClass} == set(EXPECTED)


@pytest.mark.parametrize(("failure_class", "outcome"), sorted(EXPECTED.items()))
def test_every_class_routes_as_the_table_says(
    sessions: sessionmaker[Session], failure_class: str, outcome: str
) -> None:
    with sessions() as s, s.begin():
        row = record_failure(s, NOW, failure_class, "test", machine_id="m-1", details="x")
    assert (route(failure_class).value, row.outcome) == (outcome, outcome)


@pytest.mark.parametrize("unknown", ["disk_on_fire", "", "WENT_SILENT", "went-silent"])
def test_an_unknown_class_alerts_a_human_never_a_retry(sessions: sessionmaker[Session], unknown: str) -> None:
    with sessions() as s, s.begin():
        row = record_failure(s, NOW, unknown, "test", machine_id="m-1", details="what is this")
    assert row.outcome == LedgerOutcome.ALERT_HUMAN.value
    with sessions() as s:
        assert s.execute(select(Incident.failure_class)).scalars().all() == [unknown]


def _catalog(sessions: sessionmaker[Session]) -> None:
    """The rows ``add_attempt`` would make (plan, pool, kind, workspace) and two offerings."""
    with sessions() as s, s.begin():
        s.add_all(
            [
                Plan(id="p"),
                Pool(id="pool", gpu_model="L4", slots_per_machine=2),
                JobKind(id="clip", time_limit_s=3600.0),
            ]
        )
        s.flush()
        s.add(Workspace(id="w", plan_id="p"))
        for oid, region, price in (("sim-a", "sim-1", 700_000), ("sim-b", "sim-2", 900_000)):
            s.add(
                Offering(
                    id=oid,
                    pool_id="pool",
                    rank=0,
                    provider="SIM",
                    region=region,
                    zone=f"{region}a",
                    instance_type="sim.l4",
                    gpu_model="L4",
                    gpu_count=1,
                    slots=2,
                    capacity_type="ON_DEMAND",
                    hourly_price_micros=price,
                )
            )


def _creates(sessions: sessionmaker[Session], now: datetime) -> list[str]:
    with sessions() as s:
        snapshot = load_snapshot(s, now, 86400.0)
    plan = plan_fleet(snapshot, Policy(max_running_machines=8, worker_fresh_s=60.0))
    return [a.offering_id for a in plan.scale if isinstance(a, CreateMachine)]


def test_replace_machine_ends_its_attempts_lost_and_its_demand_is_provisioned_again(
    sessions: sessionmaker[Session],
) -> None:
    _catalog(sessions)
    mid = add_machine(sessions, NOW, pool_id="pool", offering_id="sim-a")
    attempt_id = add_attempt(sessions, NOW - timedelta(minutes=10), mid)
    assert _creates(sessions, NOW) == []  # the job runs: no demand
    with sessions() as s, s.begin():
        s.get_one(Machine, mid).state = "DESTROYED"
        record_failure(
            s,
            NOW,
            "went_silent",
            "went_silent",
            machine_id=mid,
            details="silent",
            apply=True,
            policy=OutcomePolicy(lost_retry_backoff_s=30.0),
        )
    with sessions() as s:
        attempt = s.get_one(Attempt, attempt_id)
        job = s.get_one(Job, attempt.job_id)
        assert (attempt.state, attempt.charged, attempt.charge_micros) == ("LOST", False, 0)
        assert (job.state, job.lost_retries_used) == ("QUEUED", 1)
        assert s.execute(select(Incident)).scalars().all() == []
    # After its back-off the job is unmet demand: a replacement from the cheapest offering.
    assert _creates(sessions, NOW + timedelta(seconds=31)) == ["sim-a"]


def test_stop_hardware_config_quarantines_the_offering_for_its_ttl(sessions: sessionmaker[Session]) -> None:
    _catalog(sessions)
    mid = add_machine(sessions, NOW, pool_id="pool", offering_id="sim-a", state="DESTROYED")
    add_attempt(sessions, NOW, mid, state="SUCCEEDED")  # a job for the queue
    with sessions() as s, s.begin():
        s.get_one(Job, s.execute(select(Job.id)).scalar_one()).state = "QUEUED"
    policy = OutcomePolicy(offering_quarantine_ttl=timedelta(minutes=30))
    with sessions() as s, s.begin():
        first = record_failure(
            s, NOW, "stockout", "scale", machine_id=mid, details="no L4", apply=True, policy=policy
        )
        again = record_failure(
            s, NOW, "stockout", "scale", machine_id=mid, details="no L4", apply=True, policy=policy
        )
        assert first.id != again.id
    with sessions() as s:
        [q] = s.execute(select(Quarantine)).scalars().all()  # reused, not stacked
        assert (q.kind, q.offering_id, q.expires_at) == ("OFFERING", "sim-a", NOW + timedelta(minutes=30))
        assert len(s.execute(select(Incident)).scalars().all()) == 2  # a stockout is always told
    assert _creates(sessions, NOW) == ["sim-b"]  # the scale step skips the quarantined one
    assert _creates(sessions, NOW + timedelta(minutes=31)) == ["sim-a"]  # TTL over


def test_halt_provisioning_quarantines_the_provider_region_until_cleared(
    sessions: sessionmaker[Session],
) -> None:
    _catalog(sessions)
    mid = add_machine(sessions, NOW, pool_id="pool", offering_id="sim-a", region="sim-1", state="DESTROYED")
    add_attempt(sessions, NOW, mid, state="SUCCEEDED")
    with sessions() as s, s.begin():
        s.get_one(Job, s.execute(select(Job.id)).scalar_one()).state = "QUEUED"
        record_failure(s, NOW, "quota_exceeded", "scale", machine_id=mid, details="quota", apply=True)
    with sessions() as s:
        [q] = s.execute(select(Quarantine)).scalars().all()
        assert (q.kind, q.provider, q.region, q.expires_at) == ("PROVIDER_REGION", "SIM", "sim-1", None)
    assert _creates(sessions, NOW + timedelta(days=30)) == ["sim-b"]
    with sessions() as s, s.begin():
        record_failure(
            s,
            NOW,
            "auth_failed",
            "scale",
            details="bad key",
            apply=True,
            target=OutcomeTarget(provider="SIM", region="sim-2"),
        )
    assert _creates(sessions, NOW) == []  # every region halted: nothing is created
    with sessions() as s, s.begin():
        for q in s.execute(select(Quarantine)).scalars():
            q.cleared_at = NOW
    assert _creates(sessions, NOW) == ["sim-a"]


def test_alert_human_opens_one_incident_per_key(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, s.begin():
        for _ in range(2):
            record_failure(
                s,
                NOW,
                "transition_stuck",
                "stuck_transition",
                machine_id="m-1",
                details="stuck",
                incident_key="stuck:m-1",
                apply=True,
            )
    with sessions() as s:
        [incident] = s.execute(select(Incident)).scalars().all()
        assert (incident.failure_class, incident.machine_id, incident.state) == (
            "transition_stuck",
            "m-1",
            "OPEN",
        )


@pytest.mark.parametrize(
    "failure_class", ["machine_lost", "lease_expired", "job_failed", "slot_could_not_be_closed"]
)
def test_outcomes_owned_elsewhere_change_nothing_here(
    sessions: sessionmaker[Session], failure_class: str
) -> None:
    _catalog(sessions)
    mid = add_machine(sessions, NOW, pool_id="pool")
    attempt_id = add_attempt(sessions, NOW, mid)
    with sessions() as s, s.begin():
        attempt = s.get_one(Attempt, attempt_id)
        row = record_failure(
            s,
            NOW,
            failure_class,
            "test",
            machine_id=mid,
            job_id=attempt.job_id,
            attempt_id=attempt_id,
            apply=True,
        )
        applied = apply_outcome(s, NOW, row)  # applying twice is harmless too
        assert (applied.lost_attempts, applied.quarantine, applied.incident) == ([], None, None)
    with sessions() as s:
        attempt = s.get_one(Attempt, attempt_id)
        assert attempt.state == "RUNNING" and s.get_one(Job, attempt.job_id).state == "RUNNING"
        assert s.execute(select(Quarantine)).scalars().all() == []
        assert s.execute(select(Incident)).scalars().all() == []
