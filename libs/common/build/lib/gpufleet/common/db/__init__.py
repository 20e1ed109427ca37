"""The store: models, engine, migrations and repositories (scheduler, reaper, sweeper only)."""
