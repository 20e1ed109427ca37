"""The system's current time is readable over the API: what ages are counted against."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from gpufleet.v1 import fleet_service_pb2, fleet_service_pb2_grpc
from tests.support.procs import start_service


def test_get_system_time_answers_the_control_planes_own_sped_up_clock(pg_url: str, tmp_path: Path) -> None:
    origin = time.time() - 600  # started ten minutes ago, at 60x: ten hours of system time since
    svc = start_service(
        "scheduler",
        tmp_path,
        {
            "GPUFLEET_DATABASE_URL": pg_url,
            "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:9",
            "GPUFLEET_MAX_RUNNING_MACHINES": "0",
            "GPUFLEET_CLOCK": "scaled",
            "GPUFLEET_CLOCK_SPEED": "60",
            "GPUFLEET_CLOCK_ORIGIN": repr(origin),
        },
    )
    try:
        with svc.channel() as channel:
            reply = fleet_service_pb2_grpc.FleetServiceStub(channel).GetSystemTime(
                fleet_service_pb2.GetSystemTimeRequest(), timeout=5
            )
        now = reply.now.ToDatetime(tzinfo=UTC)
        ahead_h = (now - datetime.now(UTC)).total_seconds() / 3600
        assert 9.5 < ahead_h < 10.5, f"the system's clock is {ahead_h:.2f} h ahead of the wall clock"
    finally:
        svc.stop()
