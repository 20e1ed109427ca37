"""A PostgreSQL server of these tests' own, which they stop and start: the suite's shared
server (tests/conftest.py) must stay up for every other test running beside them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.common.db.migrate import upgrade
from tests.support.postgres import PostgresServer, start_postgres


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server for one test, migrated, with durable commits (see start_postgres): its own
    data folder and port, so stopping it disturbs nothing else."""
    server = start_postgres(durable_commits=True)
    server.psql("CREATE DATABASE gpufleet")
    upgrade(server.url("gpufleet"))
    try:
        yield server
    finally:
        server.stop()
