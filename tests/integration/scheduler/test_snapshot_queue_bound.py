"""The fleet tick's snapshot reads, per workspace, only the oldest queued jobs that could
start this tick (``queued_read_bound`` of its plan's cap): a tenant with a deep queue costs
every tick what its cap costs, and the jobs it does read are exactly the ones the decision
would have taken from the whole queue."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from gpufleet.common.catalog import load_catalog
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.tick.decide import queued_read_bound
from gpufleet.scheduler.tick.snapshot import load_snapshot
from tests.support.fleet_rows import add_machine, job_row

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_each_workspace_offers_its_oldest_jobs_up_to_its_plans_cap(db_url: str) -> None:
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        sync_catalog(s, load_catalog(None))
    machine = add_machine(sessions, NOW, pool_id="l4", worker_report_at=NOW)
    with sessions() as s:
        limits = load_snapshot(s, NOW, 86400).workspace_limits
    rng = random.Random(7)
    expected: dict[str, list[str]] = {}
    with sessions() as s, s.begin():
        for ws in ("acme-studio", "indie-creator"):
            ages = list(range(3 * limits[ws] + 5))
            rng.shuffle(ages)  # inserted out of age order
            waiting = []
            for age in ages:
                job_id = f"{ws}-{age:03d}"
                # Every fourth job waits out a back-off: not offered, and not counted.
                backoff = age % 4 == 0
                s.add(
                    job_row(
                        NOW - timedelta(minutes=age),
                        id=job_id,
                        workspace_id=ws,
                        not_before=NOW + timedelta(minutes=1) if backoff else None,
                    )
                )
                if not backoff:
                    waiting.append((NOW - timedelta(minutes=age), job_id))
            waiting.sort()
            expected[ws] = [job_id for _, job_id in waiting[: queued_read_bound(limits[ws])]]
        # Two jobs submitted in the same instant: the id breaks the tie, as in the decision.
        for job_id in ("indie-creator-tie-b", "indie-creator-tie-a"):
            s.add(job_row(NOW - timedelta(days=1), id=job_id, workspace_id="indie-creator"))
        # A running job does not shrink what is read: the cap is the bound, not the room.
        s.add(job_row(NOW - timedelta(hours=3), id="running", workspace_id="acme-studio", state="RUNNING"))
        s.flush()
        s.add(
            models.Attempt(
                id="running-a1",
                job_id="running",
                machine_id=machine,
                slot=0,
                state="RUNNING",
                started_at=NOW - timedelta(minutes=4),
                lease_expires_at=NOW + timedelta(minutes=1),
            )
        )
    expected["indie-creator"] = ["indie-creator-tie-a", "indie-creator-tie-b", *expected["indie-creator"]][
        : queued_read_bound(limits["indie-creator"])
    ]
    with sessions() as s:
        snapshot = load_snapshot(s, NOW, 86400)
    by_ws: dict[str, list[str]] = {}
    for job in snapshot.queued:
        by_ws.setdefault(job.workspace_id, []).append(job.id)
    assert by_ws == expected
    assert snapshot.running_per_workspace == {"acme-studio": 1}
    engine.dispose()
