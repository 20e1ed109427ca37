"""The Alembic migrations own the schema; the SQLAlchemy models must never drift from them."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from gpufleet.common.db.engine import make_engine
from gpufleet.common.db.migrate import alembic_config
from gpufleet.common.db.models import Base

# Alembic cannot compare expression indexes (it reads them back as text); their definitions
# are checked against the database catalogue in tests/integration/reaper/test_schema_0003.py.
EXPRESSION_INDEXES = {"ix_machines_running_report_clock"}


def _comparable(entry: object) -> bool:
    if isinstance(entry, tuple) and entry[0] in ("add_index", "remove_index"):
        return getattr(entry[1], "name", None) not in EXPRESSION_INDEXES
    return True


def test_models_match_the_migrated_schema(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), Base.metadata)
    diff = [d for d in diff if _comparable(d)]
    assert diff == [], f"models and migrations differ: {diff}"


def test_migrations_go_down_and_up_again(db_url: str) -> None:
    from alembic import command

    cfg = alembic_config(db_url)
    command.downgrade(cfg, "base")
    assert set(inspect(make_engine(db_url)).get_table_names()) <= {"alembic_version"}
    command.upgrade(cfg, "head")
    assert "failures" in inspect(make_engine(db_url)).get_table_names()
