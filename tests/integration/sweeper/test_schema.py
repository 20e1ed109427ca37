"""The sweeper's migrations on both stores: 0002 (``sweeps``) and 0004 (``orphans``,
``provider_listings``) match their models, and each goes down and up again."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from gpufleet.common.db.engine import make_engine
from gpufleet.common.db.migrate import alembic_config
from gpufleet.common.db.models import Base

SWEEPER_TABLES = ("sweeps", "orphans", "provider_listings")


def _tables(db_url: str) -> set[str]:
    engine = make_engine(db_url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_sweeper_tables_match_their_models(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    about_ours = [d for d in diff if any(t in repr(d) for t in SWEEPER_TABLES)]
    assert about_ours == []


@pytest.mark.parametrize(
    ("revision", "below", "tables"),
    [("0004", "0003", {"orphans", "provider_listings"}), ("0002", "0001", {"sweeps"})],
)
def test_each_migration_downgrades_and_upgrades(
    db_url: str, revision: str, below: str, tables: set[str]
) -> None:
    cfg = alembic_config(db_url)
    command.downgrade(cfg, below)
    assert not tables & _tables(db_url)
    command.upgrade(cfg, revision)
    assert tables <= _tables(db_url)
    command.upgrade(cfg, "head")
