"""Every replica of the scheduler, the reaper and the sweeper runs ``migrate`` as an init
container (deploy/kubernetes/base), so a fresh install or an upgrade starts several at once
on one PostgreSQL. They take turns (a session advisory lock): each one either applies the
migrations or finds them applied — none fails on the other's half-made tables."""

from __future__ import annotations

import itertools
import subprocess
import sys

from sqlalchemy import inspect, text

from gpufleet.common.db.engine import make_engine
from tests.support.postgres import PostgresServer

_names = itertools.count()


def test_several_migrates_at_once_on_an_empty_database_all_succeed(postgres: PostgresServer) -> None:
    name = f"concurrent_migrate_{next(_names)}"
    postgres.psql(f"CREATE DATABASE {name}")
    url = postgres.url(name)
    # Separate processes, as separate pods are: started together, each a whole migrate.
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "gpufleet.common.db.migrate", "--database-url", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [(p.wait(timeout=120), p.communicate()) for p in procs]
    for code, (out, err) in results:
        assert code == 0, err[-2000:]
        assert "database migrated to head" in out
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            versions = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        assert len(versions) == 1  # one head, written once
        assert "failures" in inspect(engine).get_table_names()
    finally:
        engine.dispose()
