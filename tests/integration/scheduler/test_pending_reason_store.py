"""The waiting jobs' reasons in the store, on PostgreSQL and SQLite: which held-back jobs the
snapshot reads (a paused workspace's, a backed-off job, those beyond the plan's read bound)
— each only until its reason is recorded, and again once its deadline nears — and what one
write of reasons does: set, clear, an event only for a reason that changed, nothing to a job
no longer queued, and the job's ``updated_at`` (its queue wait's start) untouched."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import Catalog, KindSpec, PlanSpec, PoolSpec, WorkspaceSpec
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.tick.decide import decide
from gpufleet.scheduler.tick.model import FleetSnapshot, Pending, PendingChange, Policy
from gpufleet.scheduler.tick.pending import R
from gpufleet.scheduler.tick.pending_writes import write_pending
from gpufleet.scheduler.tick.snapshot import load_snapshot
from tests.support.fleet_rows import job_row, sim_l4_offering

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
POLICY = Policy(max_running_machines=4, worker_fresh_s=60)


def catalogue() -> Catalog:
    return Catalog(
        plans=[PlanSpec(id="one", max_gpu_jobs=1)],
        workspaces=[WorkspaceSpec(id="paused", plan="one"), WorkspaceSpec(id="busy", plan="one")],
        kinds=[KindSpec(id="clip", time_limit_s=600, queue_wait_deadline_s=3600)],
        pools=[PoolSpec(id="l4", slots_per_machine=2, max_machines=2, offerings=[sim_l4_offering()])],
    )


@dataclass
class Store:
    sessions: sessionmaker[Session]

    def job(self, job_id: str, workspace: str, age_s: float = 60, **values: object) -> str:
        with self.sessions() as s, s.begin():
            at = NOW - timedelta(seconds=age_s)
            s.add(job_row(at, id=job_id, workspace_id=workspace, pool_id="l4", kind_id="clip", **values))
        return job_id

    def snapshot(self, now: datetime = NOW) -> FleetSnapshot:
        with self.sessions() as s:
            return load_snapshot(s, now, 86400)

    def tick(self, now: datetime = NOW) -> list[PendingChange]:
        """What a tick decides and writes about its waiting jobs (its other work aside)."""
        snap = self.snapshot(now)
        plan = decide(snap, POLICY)
        with self.sessions() as s, s.begin():
            write_pending(s.connection(), plan.pending, now)
        return plan.pending

    def pause(self, workspace: str, active: bool = False) -> None:
        with self.sessions() as s, s.begin():
            s.execute(update(models.Workspace).where(models.Workspace.id == workspace).values(active=active))

    def row(self, job_id: str) -> models.Job:
        with self.sessions() as s:
            return s.get_one(models.Job, job_id)

    def events(self, job_id: str) -> list[tuple[str, str]]:
        with self.sessions() as s:
            E = models.JobEvent
            return [
                (r.state, r.message)
                for r in s.execute(select(E.state, E.message).where(E.job_id == job_id).order_by(E.id))
            ]


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        sync_catalog(s, catalogue())
    yield Store(sessions)
    engine.dispose()


def test_a_paused_workspaces_jobs_are_read_until_they_say_so_and_again_near_their_deadline(
    store: Store,
) -> None:
    jobs = [store.job(f"p{n}", "paused", age_s=60 - n) for n in range(3)]
    store.pause("paused")
    snap = store.snapshot()
    assert snap.queued == []
    assert [(h.id, h.workspace_active) for h in snap.held_back] == [(j, False) for j in jobs]

    changes = store.tick()
    assert {(c.job_id, c.pending.reason, c.reason_changed) for c in changes if c.pending} == {
        (j, R.WORKSPACE_PAUSED, True) for j in jobs
    }
    row = store.row("p0")
    assert (row.pending_reason, row.pending_message) == (
        "WORKSPACE_PAUSED",
        "workspace paused is paused; it starts once it is resumed",
    )
    assert store.events("p0")[-1] == (
        "QUEUED",
        "waiting: workspace paused is paused; it starts once it is resumed",
    )
    # Said once: the next ticks read none of them and write nothing.
    assert store.snapshot(NOW + timedelta(seconds=5)).held_back == []
    assert store.tick(NOW + timedelta(seconds=5)) == []

    # 90 % of the kind's hour waited: read again, and told the deadline is near.
    late = NOW + timedelta(seconds=3300)
    assert [h.id for h in store.snapshot(late).held_back] == jobs
    store.tick(late)
    assert store.row("p0").pending_reason == "QUEUE_WAIT_DEADLINE_NEAR"
    assert "workspace paused is paused" in (store.row("p0").pending_message or "")
    assert store.snapshot(late + timedelta(seconds=5)).held_back == []


def test_a_backed_off_job_and_the_jobs_beyond_the_plans_bound_are_held_back_until_told(store: Store) -> None:
    backed_off = store.job("b", "busy", age_s=90, not_before=NOW + timedelta(seconds=30), attempt_count=1)
    first, second = store.job("j1", "busy", age_s=60), store.job("j2", "busy", age_s=30)
    snap = store.snapshot()
    # The plan runs one job at a time: the oldest job free to run is decided over, the
    # other two held back (one backing off, one beyond the bound).
    assert [j.id for j in snap.queued] == [first]
    assert sorted(h.id for h in snap.held_back) == [backed_off, second]

    store.tick()
    assert store.row(backed_off).pending_reason == "DISPATCH_BACKOFF"
    assert store.row(second).pending_reason == "PLAN_CONCURRENCY_LIMIT"
    assert store.row(first).pending_reason == "WAITING_FOR_CAPACITY"  # no machine: one is created
    assert store.snapshot(NOW + timedelta(seconds=1)).held_back == []
    # The back-off over, the job is looked at again (and is the oldest: decided over).
    after = store.snapshot(NOW + timedelta(seconds=31))
    assert [j.id for j in after.queued] == [backed_off]
    assert {h.id for h in after.held_back} == {first}  # now beyond the bound, told otherwise


def test_one_write_sets_and_clears_tells_watchers_of_new_reasons_only_and_spares_other_jobs(
    store: Store,
) -> None:
    waiting = store.job("w", "busy", attempt_count=1, updated_at=NOW - timedelta(minutes=5))
    running = store.job("r", "busy", state="RUNNING")
    cleared = store.job("c", "busy", pending_reason="POOL_AT_CEILING", pending_message="full")
    capacity = Pending(R.WAITING_FOR_CAPACITY, "a machine of pool l4 is on its way for it", NOW)
    with store.sessions() as s, s.begin():
        written = write_pending(
            s.connection(),
            [
                PendingChange(waiting, capacity, reason_changed=True),
                PendingChange(running, capacity, reason_changed=True),
                PendingChange(cleared, None, reason_changed=True),
            ],
            NOW,
        )
    assert (written.set, written.cleared, written.events) == (1, 1, 1)
    row = store.row(waiting)
    assert (row.pending_reason, row.pending_ready_at) == ("WAITING_FOR_CAPACITY", NOW)
    assert row.updated_at == NOW - timedelta(minutes=5)  # its wait still counts from its requeue
    assert store.row(running).pending_reason is None
    assert (store.row(cleared).pending_reason, store.row(cleared).pending_message) == (None, None)
    assert store.events(waiting) == [("QUEUED", "waiting: a machine of pool l4 is on its way for it")]
    assert store.events(running) == [] and store.events(cleared) == []

    # Only the time moved: written, no event.
    later = Pending(capacity.reason, capacity.message, NOW + timedelta(minutes=3))
    with store.sessions() as s, s.begin():
        written = write_pending(s.connection(), [PendingChange(waiting, later, reason_changed=False)], NOW)
    assert (written.set, written.events) == (1, 0)
    assert store.row(waiting).pending_ready_at == NOW + timedelta(minutes=3)
    assert len(store.events(waiting)) == 1
