"""The Alembic migrations own the schema; the SQLAlchemy models must never drift from them."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from gpufleet.common.db.engine import make_engine
from gpufleet.common.db.migrate import alembic_config
from gpufleet.common.db.models import Base


def test_models_match_the_migrated_schema(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), Base.metadata)
    assert diff == [], f"models and migrations differ: {diff}"


def test_migrations_go_down_and_up_again(db_url: str) -> None:
    from alembic import command

    cfg = alembic_config(db_url)
    command.downgrade(cfg, "base")
    assert set(inspect(make_engine(db_url)).get_table_names()) <= {"alembic_version"}
    command.upgrade(cfg, "head")
    assert "failures" in inspect(make_engine(db_url)).get_table_names()
