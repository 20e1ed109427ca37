"""``python -m gpufleet.reaper`` as a real process: it serves, leads, runs its nets, and
stops gracefully on SIGTERM, giving its lease up so another replica takes over at once."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.db.models import LeaderLease, WatchdogStat
from gpufleet.v1 import reaper_service_pb2, reaper_service_pb2_grpc
from tests.support.procs import start_service


def test_reaper_process_serves_leads_and_stops_on_sigterm(pg_url: str, tmp_path: Path) -> None:
    proc = start_service(
        "reaper",
        tmp_path,
        {
            "GPUFLEET_DATABASE_URL": pg_url,
            "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:1",
            "GPUFLEET_INSTANCE_NAME": "reaper-under-test",
            "GPUFLEET_CLOCK": "real",
        },
    )
    sessions = make_sessionmaker(make_engine(pg_url))
    try:
        with proc.channel() as channel:
            stub = reaper_service_pb2_grpc.ReaperServiceStub(channel)
            deadline = time.monotonic() + 20
            while True:
                dogs = stub.ListWatchdogs(reaper_service_pb2.ListWatchdogsRequest(), timeout=5).watchdogs
                if dogs and all(d.runs >= 1 for d in dogs):
                    break
                assert time.monotonic() < deadline, proc.log()
                time.sleep(0.1)
        assert sorted(d.watchdog_id for d in dogs) == [
            "auto_destroy",
            "auto_stop",
            "boot_failure",
            "gpu_fault",
            "idle_scanner",
            "lost_detector",
            "provision_deadline",
            "stuck_transition",
            "went_silent",
        ]
        with sessions() as s:
            lease = s.execute(select(LeaderLease).where(LeaderLease.name == "reaper")).scalar_one()
        assert lease.holder == "reaper-under-test"
    finally:
        proc.stop(timeout=45)  # the service bounds its own stop at grace 5 s + 35 s join
    assert proc.process.returncode == 0, proc.log()
    with sessions() as s:
        lease = s.execute(select(LeaderLease).where(LeaderLease.name == "reaper")).scalar_one()
        assert lease.expires_at <= datetime.now(UTC)  # released, not left to lapse
        assert s.get(WatchdogStat, "idle_scanner") is not None
