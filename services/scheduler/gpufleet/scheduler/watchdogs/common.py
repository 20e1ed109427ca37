"""What the scheduler's request-level watchdogs share: when a queued job began waiting,
and how much one run may do."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import TypeVar

from sqlalchemy import ColumnElement, case

from gpufleet.common.db import models

T = TypeVar("T")

# One run acts on at most this many jobs, this many to a transaction: a mass expiry is
# spread over runs, and no transaction holds many row locks.
MAX_PER_RUN = 1000
PER_TRANSACTION = 200


def queued_since() -> ColumnElement[datetime]:
    """When a queued job began its current wait: its submission, or — for a job that went
    back to the queue after an attempt — the moment it did (its state's last change)."""
    return case((models.Job.attempt_count > 0, models.Job.updated_at), else_=models.Job.created_at)


def waiting_since(job: models.Job) -> datetime:
    """:func:`queued_since` for a loaded row (the apply step's re-check)."""
    return job.updated_at if job.attempt_count > 0 else job.created_at


def batches(items: Sequence[T], size: int = PER_TRANSACTION) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
