"""Fixtures shared by the whole suite: the throwaway PostgreSQL server, and a fresh,
migrated database per test on PostgreSQL or SQLite."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.common.db.migrate import upgrade
from tests.support.postgres import PostgresServer, start_postgres

_counter = itertools.count()

# Every service a test starts serves its metrics listener on a port of its own choosing: the
# defaults (127.0.0.1:9451-9454) would collide between a test's several schedulers, between
# tests run side by side, and with a developer's own `gpufleet up`. A test that means a
# port (tests/e2e/test_prometheus_scrape.py, through `gpufleet up`) names it.
os.environ.setdefault("GPUFLEET_METRICS_ADDRESS", "127.0.0.1:0")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = start_postgres()
    # One migrated template; each test gets a copy of it (CREATE DATABASE ... TEMPLATE).
    server.psql("CREATE DATABASE gpufleet_template")
    upgrade(server.url("gpufleet_template"))
    yield server
    server.stop()


def fresh_postgres_url(server: PostgresServer) -> str:
    name = f"t{next(_counter)}"
    server.psql(f"CREATE DATABASE {name} TEMPLATE gpufleet_template")
    return server.url(name)


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """A fresh, migrated PostgreSQL database for this test."""
    return fresh_postgres_url(postgres)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'gpufleet.sqlite'}"
    upgrade(url)
    return url


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Run the test on both stores: PostgreSQL (production) and SQLite (embedded)."""
    if request.param == "postgresql":
        return fresh_postgres_url(request.getfixturevalue("postgres"))
    return str(request.getfixturevalue("sqlite_url"))
