"""Migration 0002 (``sweeps``) on both stores: it matches the model, and it goes down and up."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from gpufleet.common.db.engine import make_engine
from gpufleet.common.db.migrate import alembic_config
from gpufleet.common.db.models import Base


def test_sweeps_table_matches_its_model(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    about_sweeps = [d for d in diff if "sweeps" in repr(d)]
    assert about_sweeps == []


def test_0002_downgrades_and_upgrades(db_url: str) -> None:
    cfg = alembic_config(db_url)
    command.downgrade(cfg, "0001")
    engine = make_engine(db_url)
    assert "sweeps" not in inspect(engine).get_table_names()
    engine.dispose()
    command.upgrade(cfg, "head")
    engine = make_engine(db_url)
    assert "sweeps" in inspect(engine).get_table_names()
    engine.dispose()
