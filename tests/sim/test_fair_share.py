"""The simulator's fair-share usage is the scheduler's: the same attempts, written as rows
and read by the scheduler's own snapshot query, and fed to the simulator's incremental
``WindowUsage``, give each workspace the same slot-seconds at every instant — live
attempts counted so far, ended ones whole while their end is inside the window, gone once
it leaves. (The simulator had decayed usage with a one-day half-life and left live
attempts out: issue #26's fair-share drift.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common.catalog import load_catalog
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.settings import Settings
from gpufleet.scheduler.tick.snapshot import load_snapshot
from gpufleet.sim.clock import EPOCH
from gpufleet.sim.fair_share import WindowUsage, next_order_change
from tests.support.fleet_rows import add_machine, job_row

H = 3600.0
WINDOW = Settings().fair_share_window_s  # the simulator reads the scheduler's own setting

# (workspace, started, ended or None while live, slots), in the simulator's seconds.
ATTEMPTS = [
    ("acme-studio", 0.0, 2 * H, 1),  # ends early: leaves the window a day later
    ("acme-studio", 1 * H, 30 * H, 1),
    ("acme-studio", 20 * H, None, 2),  # a film on a whole two-slot machine, still running
    ("indie-creator", 5 * H, 6 * H, 1),
    ("indie-creator", 10 * H, None, 1),
    ("indie-creator", 26 * H, 27 * H, 1),
]


def test_the_simulators_usage_is_the_schedulers_query(sqlite_url: str) -> None:
    sessions: sessionmaker[Session] = make_sessionmaker(make_engine(sqlite_url))
    with sessions() as s, s.begin():
        sync_catalog(s, load_catalog(None))
    machine = add_machine(sessions, EPOCH, pool_id="l4", slots=2)
    usage = WindowUsage(WINDOW)
    events = sorted(
        [(start, "start", i) for i, (_, start, _, _) in enumerate(ATTEMPTS)]
        + [(end, "end", i) for i, (_, _, end, _) in enumerate(ATTEMPTS) if end is not None]
    )
    for _at, what, i in events:
        ws, start, end, slots = ATTEMPTS[i]
        if what == "start":
            usage.started(ws, start, slots)
        else:
            assert end is not None
            usage.ended(ws, start, end, slots)
    with sessions() as s, s.begin():
        for i, (ws, start, end, slots) in enumerate(ATTEMPTS):
            s.add(
                job_row(
                    EPOCH, id=f"job-{i}", workspace_id=ws, state="RUNNING" if end is None else "SUCCEEDED"
                )
            )
            s.flush()
            s.add(
                models.Attempt(
                    id=f"att-{i}",
                    job_id=f"job-{i}",
                    machine_id=machine,
                    slot=0,
                    slots=slots,
                    state="RUNNING" if end is None else "SUCCEEDED",
                    started_at=EPOCH + timedelta(seconds=start),
                    ended_at=None if end is None else EPOCH + timedelta(seconds=end),
                    slot_seconds=0.0 if end is None else (end - start) * slots,
                    lease_expires_at=EPOCH + timedelta(days=30),
                )
            )
    seen = []
    # Reads only move forward, as the simulator's do (its queue of ends is evicted in place).
    for now in (30 * H, 31 * H, 40 * H, 50 * H, 54 * H, 60 * H):
        with sessions() as s:
            scheduler = load_snapshot(s, EPOCH + timedelta(seconds=now), WINDOW).usage_per_workspace
        for ws in ("acme-studio", "indie-creator"):
            assert usage.at(ws, now) == pytest.approx(scheduler.get(ws, 0.0)), (ws, now / H)
            seen.append(usage.at(ws, now))
    # The window moved: the first ends left it, so the usage is not a sum that only grows.
    assert usage.at("indie-creator", 60 * H) < 60 * H
    assert len(set(seen)) > 4


def test_the_next_order_change_is_ahead_of_evictions_not_yet_read() -> None:
    # Both workspaces idle now; a's one ended attempt left the window before ``now`` though
    # nothing read its usage since, b's leaves it at 160. The order can next change then
    # (b's usage drops to a's), not at once — a past eviction read as "due" woke the pool
    # at every tick.
    usage = WindowUsage(100.0)
    usage.started("a", 0.0, 1)
    usage.ended("a", 0.0, 10.0, 1)
    usage.started("b", 0.0, 1)
    usage.ended("b", 0.0, 60.0, 1)
    assert next_order_change(usage, {"a": 1.0, "b": 1.0}, 130.0) == 160.0
    # Growing usage crosses first: a runs four slots from 130 and reaches b's 60
    # slot-seconds 15 s later, before b's eviction.
    usage.started("a", 130.0, 4)
    assert next_order_change(usage, {"a": 1.0, "b": 1.0}, 130.0) == 130.0 + 60.0 / 4
