"""Run the Alembic migrations programmatically (``gpufleet migrate`` and the tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

_HERE = Path(__file__).resolve().parent


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(_HERE / "migrations"))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


# The PostgreSQL advisory lock every migrate holds while it upgrades (a constant of this
# project's own: b"gpufleet" read as a signed 64-bit integer).
MIGRATE_LOCK = int.from_bytes(b"gpufleet", "big", signed=True)


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (idempotent).

    On PostgreSQL the upgrade holds a session advisory lock: every replica of the scheduler,
    the reaper and the sweeper runs ``migrate`` as an init container, so a fresh install
    starts several at once, and two alembic upgrades racing on an empty database fail
    (``duplicate key value violates unique constraint "pg_type_typname_nsp_index"`` — both
    creating the same table). With the lock they take turns: the first applies the
    migrations, the others find them applied. SQLite has one writer at a time already."""
    cfg = alembic_config(url)
    if not url.startswith("postgresql"):
        command.upgrade(cfg, revision)
        return
    from sqlalchemy import text

    from gpufleet.common.db.engine import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            # Session-level: held across the transaction alembic opens on this connection,
            # and released when the connection closes however the upgrade ends.
            conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATE_LOCK})
            conn.commit()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
            conn.commit()
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATE_LOCK})
            conn.commit()
    finally:
        engine.dispose()


# ``--has-run``'s exit codes: the CLI may not import a database library (its import
# contract), so it asks this module in a process of its own.
HAS_RUN, NEVER_RAN, UNREACHABLE = 0, 3, 4


def has_run(url: str) -> bool:
    """Whether a control plane already migrated the database at ``url`` (the migrations'
    version table exists): its times were then written on some clock."""
    from sqlalchemy import create_engine, inspect

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return inspect(conn).has_table("alembic_version")
    finally:
        engine.dispose()


def main() -> None:
    import argparse
    import os
    import sys

    from sqlalchemy.exc import SQLAlchemyError

    parser = argparse.ArgumentParser(description="Apply gpufleet's database migrations.")
    parser.add_argument("--database-url", default=os.environ.get("GPUFLEET_DATABASE_URL"))
    parser.add_argument(
        "--has-run",
        action="store_true",
        help=f"migrate nothing; exit {HAS_RUN} if the database was migrated before, {NEVER_RAN} if "
        f"not, {UNREACHABLE} (the reason on stderr) if it cannot be read",
    )
    args = parser.parse_args()
    if not args.database_url:
        parser.error("--database-url or GPUFLEET_DATABASE_URL is required")
    if args.has_run:
        try:
            sys.exit(HAS_RUN if has_run(args.database_url) else NEVER_RAN)
        except SQLAlchemyError as exc:
            print(exc, file=sys.stderr)
            sys.exit(UNREACHABLE)
    upgrade(args.database_url)
    print("gpufleet: database migrated to head")


if __name__ == "__main__":
    main()
