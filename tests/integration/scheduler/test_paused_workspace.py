"""A paused workspace (WorkspaceService.UpdateWorkspace active=false): its queued jobs wait
— the fleet tick's snapshot does not offer them — and its running ones go on, their
leases and time limits watched as before; resumed, its jobs are offered again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import update

from gpufleet.common.catalog import load_catalog
from gpufleet.common.db import models
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.scheduler.catalog_sync import sync_catalog
from gpufleet.scheduler.tick.snapshot import load_snapshot
from tests.support.fleet_rows import add_machine, job_row

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_a_paused_workspaces_queue_waits_and_its_running_jobs_go_on(db_url: str) -> None:
    engine = make_engine(db_url)
    sessions = make_sessionmaker(engine)
    with sessions() as s, s.begin():
        sync_catalog(s, load_catalog(None))
    machine = add_machine(sessions, NOW, pool_id="l4", worker_report_at=NOW)
    with sessions() as s, s.begin():
        for job_id, state in (("queued", "QUEUED"), ("running", "RUNNING")):
            s.add(job_row(NOW - timedelta(minutes=5), id=job_id, workspace_id="indie-creator", state=state))
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

    def pause(active: bool) -> None:
        with sessions() as s, s.begin():
            s.execute(
                update(models.Workspace).where(models.Workspace.id == "indie-creator").values(active=active)
            )

    def snapshot():  # type: ignore[no-untyped-def]
        with sessions() as s:
            return load_snapshot(s, NOW, 86400)

    assert [j.id for j in snapshot().queued] == ["queued"]
    pause(False)
    paused = snapshot()
    assert paused.queued == []
    assert [a.id for a in paused.live_attempts] == ["running-a1"]  # still watched, still running
    pause(True)
    assert [j.id for j in snapshot().queued] == ["queued"]
    engine.dispose()
