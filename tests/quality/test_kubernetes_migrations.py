"""The migrations as the Kubernetes manifests run them: an init container in every pod with
database access, so a fresh install starts several at once on one empty database. Each is run
here as its manifest says, on a real PostgreSQL: every one either migrates or fails, and a
failed one, restarted as the kubelet restarts an init container, then finds the schema at
its head — the same schema one run alone makes (docs/kubernetes.md "Upgrading")."""

from __future__ import annotations

import os
import subprocess
import sys

import sqlalchemy as sa
from alembic.script import ScriptDirectory

from gpufleet.common.db.migrate import alembic_config
from tests.quality._kubernetes import KUSTOMIZE, parts, render
from tests.quality._repo import REPO
from tests.support.postgres import PostgresServer

# The kubelet restarts a failed init container with a back-off; a pod whose migrations
# failed this many times is stuck, which is what this test would catch.
RESTARTS = 3


def init_migrations() -> list[list[str]]:
    """The migrate init containers of the production overlay's pods, one per replica."""
    argvs = []
    for workload in parts(render(KUSTOMIZE / "overlays" / "production")):
        for init in workload.pod.get("initContainers") or []:
            argv = [*init["command"], *(init.get("args") or [])]
            argvs += [argv] * int(workload.doc["spec"]["replicas"])
    return argvs


def start(argv: list[str], url: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    # `python` in the image is the venv's: here, the test run's own interpreter.
    command = [sys.executable, *argv[1:]] if argv[0] == "python" else argv
    return subprocess.Popen(
        command,
        cwd=REPO,
        env={**env, "GPUFLEET_DATABASE_URL": url},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def schema(url: str) -> tuple[str, set[str]]:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as connection:
            version = connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
            tables = set(sa.inspect(connection).get_table_names())
    finally:
        engine.dispose()
    return str(version), tables


def test_every_pod_s_migrations_at_once_end_at_head(postgres: PostgresServer) -> None:
    argvs = init_migrations()
    assert len(argvs) == 6  # scheduler, reaper and sweeper: two replicas each
    postgres.psql("CREATE DATABASE k8s_race")
    postgres.psql("CREATE DATABASE k8s_alone")
    race, alone = postgres.url("k8s_race"), postgres.url("k8s_alone")

    pending = [start(argv, race) for argv in argvs]
    outcomes: list[tuple[int, str]] = []
    for attempt in range(RESTARTS + 1):
        failed = []
        for process, argv in zip(pending, argvs, strict=False):
            _out, err = process.communicate(timeout=120)
            outcomes.append((attempt, err))
            if process.returncode != 0:
                failed.append(argv)
        if not failed:
            break
        argvs, pending = failed, [start(argv, race) for argv in failed]
    else:
        raise AssertionError(f"still failing after {RESTARTS} restarts:\n{outcomes[-1][1]}")

    solo = start(init_migrations()[0], alone)
    assert solo.wait(timeout=120) == 0, solo.communicate()[1]
    head = ScriptDirectory.from_config(alembic_config(alone)).get_current_head()
    assert schema(race) == schema(alone) == (head, schema(alone)[1])
    assert "machines" in schema(race)[1]
