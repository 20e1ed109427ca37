"""Migration 0003 (the nets' indexes) on both stores: it matches the models, and it goes
down and up."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from gpufleet.common.db.engine import make_engine
from gpufleet.common.db.migrate import alembic_config
from gpufleet.common.db.models import REAPER_NET_INDEXES, Base

NAMES = {str(i.name) for i in REAPER_NET_INDEXES}
# Alembic cannot compare an expression index (it compares their text, which the database
# rewrites); its definition is checked from the catalogue instead.
EXPRESSION = "ix_machines_running_report_clock"


def _machine_indexes(url: str) -> dict[str, str]:
    """Index name -> its definition, straight from the catalogue."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "sqlite":
                rows = conn.execute(
                    text("SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'machines'")
                )
            else:
                rows = conn.execute(
                    text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'machines'")
                )
            return {str(name): str(sql or "") for name, sql in rows}
    finally:
        engine.dispose()


def test_the_nets_indexes_match_their_models(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    about_ours = [d for d in diff if any(n in repr(d) for n in NAMES - {EXPRESSION})]
    assert about_ours == []
    indexes = _machine_indexes(db_url)
    assert set(indexes) >= NAMES
    clock = " ".join(indexes[EXPRESSION].split())
    assert "CASE WHEN" in clock and "worker_report_at" in clock and "WHERE" not in clock
    for name in NAMES - {EXPRESSION}:
        assert "WHERE" in indexes[name].upper(), name  # every other one is partial


def test_0003_downgrades_and_upgrades(db_url: str) -> None:
    cfg = alembic_config(db_url)
    command.downgrade(cfg, "0002")
    assert not NAMES & set(_machine_indexes(db_url))
    command.upgrade(cfg, "head")
    assert set(_machine_indexes(db_url)) >= NAMES
