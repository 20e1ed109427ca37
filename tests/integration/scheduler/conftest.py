"""A real scheduler process on a fresh PostgreSQL database, for the scheduler's API tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import ServiceProcess, start_service


@pytest.fixture
def scheduler(pg_url: str, tmp_path: Path) -> Iterator[ServiceProcess]:
    # The provisioner address points nowhere: no test here needs a machine.
    svc = start_service(
        "scheduler",
        tmp_path,
        {
            "GPUFLEET_DATABASE_URL": pg_url,
            "GPUFLEET_PROVISIONER_ADDRESS": "127.0.0.1:9",
            "GPUFLEET_MAX_RUNNING_MACHINES": "0",
        },
    )
    yield svc
    svc.stop()
