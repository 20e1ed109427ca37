from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.fleet import Fleet, make_fleet


@pytest.fixture
def fleet(pg_url: str) -> Iterator[Fleet]:
    import tempfile

    # A short root: Unix socket paths and log paths stay well under their limits.
    root = Path(tempfile.mkdtemp(prefix="gfe2e-", dir="/tmp"))
    f = make_fleet(root, pg_url)
    yield f
    f.close()
