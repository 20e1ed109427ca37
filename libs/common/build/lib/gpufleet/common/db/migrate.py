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


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (idempotent)."""
    command.upgrade(alembic_config(url), revision)


def main() -> None:
    import argparse
    import os

    parser = argparse.ArgumentParser(description="Apply gpufleet's database migrations.")
    parser.add_argument("--database-url", default=os.environ.get("GPUFLEET_DATABASE_URL"))
    args = parser.parse_args()
    if not args.database_url:
        parser.error("--database-url or GPUFLEET_DATABASE_URL is required")
    upgrade(args.database_url)
    print("gpufleet: database migrated to head")


if __name__ == "__main__":
    main()
