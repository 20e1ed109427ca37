"""The queue's depth by kind and plan tier, and each workspace's jobs that could start now:
the figures the fleet tick's snapshot cannot give, so one grouped query of their own.

The snapshot reads only what a tick can act on — each workspace's oldest few queued jobs
(``queued_read_bound``: a free tenant with 100k queued jobs costs a tick what two cost),
none still in back-off and none of a paused workspace — so counting its jobs would show an
operator a queue of a few dozen while thousands wait, and a plan cap holding two jobs where
it holds thousands. The count is one grouped query over the QUEUED jobs (the ``state,
created_at`` index finds them), cheaper than the snapshot's own ranking of the same rows,
read by a task of the tick's dispatch pool in a session of its own: never on the tick's path
nor inside one of its transactions, and a failure costs the figures, never the tick.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.orm import Session

from gpufleet.common.db import models
from gpufleet.common.db.enums import JobState

QueueKey = tuple[str, str]  # (kind, plan tier)


@dataclass(frozen=True)
class QueueCount:
    """What one count read."""

    # (kind, plan tier) -> QUEUED jobs, with a zero for every kind of the catalogue at every
    # tier a plan has (a handful of each).
    by_kind: dict[QueueKey, int]
    # workspace -> its QUEUED jobs that could start now (its workspace active, their back-off
    # over): what its plan's cap is weighed against, as the tick's snapshot reads them. Only
    # workspaces with queued jobs.
    startable: dict[str, int]
    # Every plan's tier, as a label.
    tiers: tuple[str, ...]


def queued_jobs(session: Session, now: datetime) -> QueueCount:
    """QUEUED jobs by kind and their workspace's plan tier, and each workspace's that could
    start at ``now`` (the tick's own test, :func:`~gpufleet.scheduler.tick.snapshot.load_snapshot`'s
    ``free_now``): one grouped statement, a row per kind and workspace with queued jobs."""
    J, W, P = models.Job, models.Workspace, models.Plan
    free_now = and_(W.active.is_(True), or_(J.not_before.is_(None), J.not_before <= now))
    by_kind: Counter[QueueKey] = Counter()
    startable: Counter[str] = Counter()
    for kind, tier, workspace, n, free in session.execute(
        select(J.kind_id, P.tier, J.workspace_id, func.count(), func.sum(case((free_now, 1), else_=0)))
        .join(W, W.id == J.workspace_id)
        .join(P, P.id == W.plan_id)
        .where(J.state == JobState.QUEUED.value)
        .group_by(J.kind_id, P.tier, J.workspace_id)
    ).all():
        by_kind[(kind, str(tier))] += n
        startable[workspace] += int(free or 0)
    kinds = session.execute(select(models.JobKind.id)).scalars().all()
    tiers = tuple(str(t) for t in sorted(session.execute(select(P.tier).distinct()).scalars().all()))
    counts = dict(by_kind)
    for kind in kinds:
        for tier in tiers:
            counts.setdefault((kind, tier), 0)
    return QueueCount(by_kind=counts, startable=dict(startable), tiers=tiers)
