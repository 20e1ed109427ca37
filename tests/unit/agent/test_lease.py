"""The attempt's lease file: what the worker writes and the runner reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpufleet.agent.lease import Renewal, fenced, read_renewal, renew
from gpufleet.agent.statedir import AttemptFiles

T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("since_s", "lease_s", "stop"),
    [
        (0.0, 90.0, False),
        (44.9, 90.0, False),
        (45.0, 90.0, True),  # half of the lease: the fence
        (450.0, 900.0, True),
        (449.0, 900.0, False),
    ],
)
def test_the_fence_falls_at_half_the_lease(since_s: float, lease_s: float, stop: bool) -> None:
    assert fenced(T0 + timedelta(seconds=since_s), Renewal(T0, lease_s)) is stop


def test_no_renewal_no_fence() -> None:
    assert not fenced(T0 + timedelta(days=1), None)


def test_a_renewal_never_moves_back(tmp_path: Path) -> None:
    files = AttemptFiles(tmp_path)
    renew(files, T0 + timedelta(seconds=10), 90.0)
    renew(files, T0, 90.0)  # an older answer, written late
    assert read_renewal(files) == Renewal(T0 + timedelta(seconds=10), 90.0)
    renew(files, T0 + timedelta(seconds=20), 60.0)
    assert read_renewal(files) == Renewal(T0 + timedelta(seconds=20), 60.0)


def test_an_unreadable_lease_file_reads_as_none(tmp_path: Path) -> None:
    files = AttemptFiles(tmp_path)
    files.lease.write_text("{not json")
    assert read_renewal(files) is None
