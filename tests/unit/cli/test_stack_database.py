"""`gpufleet up --database-url` (or GPUFLEET_DATABASE_URL) runs the stack on a PostgreSQL
database instead of the state dir's SQLite file, and the state dir's clock stays right for
it: a database that already ran has its times on some clock, so a fresh state dir with
another speed is refused exactly as for a SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.cli.main import build_parser
from gpufleet.cli.stack import ClockMismatch, DatabaseUnreachable, Stack, StackConfig
from tests.support.postgres import PostgresServer, free_port

pytestmark = pytest.mark.postgres


def stack(state_dir: Path, speed: float, url: str) -> Stack:
    state_dir.mkdir(parents=True, exist_ok=True)
    ports = {"provisioner": 1, "scheduler": 2}
    return Stack(StackConfig(state_dir=state_dir, ports=ports, clock_speed=speed, external_database_url=url))


def test_the_services_are_given_the_operators_database_and_no_sqlite_file_is_made(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    postgres.psql("CREATE DATABASE up_fresh")
    url = postgres.url("up_fresh")
    s = stack(tmp_path / "var", 10.0, url)
    s.keep_clock()
    s.migrate()
    assert s.common_env()["GPUFLEET_DATABASE_URL"] == url
    assert not (tmp_path / "var" / "gpufleet.sqlite").exists()
    clock = json.loads((tmp_path / "var" / "clock.json").read_text())
    assert clock["speed"] == 10.0 and clock["origin"] == s.config.clock_origin
    assert s.config.database_has_run()


def test_a_fresh_state_dir_on_a_database_that_already_ran_keeps_its_speed(
    tmp_path: Path, pg_url: str
) -> None:
    # pg_url is migrated (it ran), and this state dir has no clock.json: it ran at speed 1.
    with pytest.raises(ClockMismatch, match="--speed 1"):
        stack(tmp_path / "new", 10.0, pg_url).keep_clock()
    real_time = stack(tmp_path / "other", 1.0, pg_url)
    real_time.keep_clock()
    assert json.loads((tmp_path / "other" / "clock.json").read_text()) == {"speed": 1.0, "origin": None}


def test_a_restart_on_the_same_state_dir_and_database_goes_on_from_its_origin(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    postgres.psql("CREATE DATABASE up_restart")
    url = postgres.url("up_restart")
    first = stack(tmp_path, 30.0, url)
    first.keep_clock()
    first.migrate()
    again = stack(tmp_path, 30.0, url)
    again.keep_clock()
    assert again.config.clock_origin == first.config.clock_origin
    with pytest.raises(ClockMismatch):
        stack(tmp_path, 60.0, url).keep_clock()


def test_a_database_that_cannot_be_reached_is_said_before_anything_starts(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://nobody@127.0.0.1:{free_port()}/gpufleet?connect_timeout=2"
    with pytest.raises(DatabaseUnreachable, match="--database-url"):
        stack(tmp_path, 10.0, url).keep_clock()
    assert not (tmp_path / "clock.json").exists()


def test_the_flag_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_DATABASE_URL", "postgresql+psycopg://u@h:5432/d")
    assert build_parser().parse_args(["up"]).database_url == "postgresql+psycopg://u@h:5432/d"
    monkeypatch.delenv("GPUFLEET_DATABASE_URL")
    assert build_parser().parse_args(["up"]).database_url == ""
