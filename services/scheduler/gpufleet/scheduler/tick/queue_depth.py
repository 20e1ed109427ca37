"""The queue's depth by kind and plan tier: the one figure the fleet tick's snapshot cannot
give, so it is one query of its own.

The snapshot reads only what a tick can act on — each workspace's oldest few queued jobs
(``queued_read_bound``: a free tenant with 100k queued jobs costs a tick what two cost),
none still in back-off and none of a paused workspace — so counting its jobs would show an
operator a queue of a few dozen while thousands wait. The count is one grouped query over
the QUEUED jobs (the ``state, created_at`` index finds them), cheaper than the snapshot's
own ranking of the same rows, read by a task of the tick's dispatch pool in a session of
its own: never on the tick's path nor inside one of its transactions, and a failure costs
the figure, never the tick.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gpufleet.common.db import models
from gpufleet.common.db.enums import JobState

QueueKey = tuple[str, str]  # (kind, plan tier)


def queued_jobs(session: Session) -> dict[QueueKey, int]:
    """QUEUED jobs by kind and their workspace's plan tier, with a zero for every kind of
    the catalogue at every tier a plan has (a handful of each)."""
    J, W, P = models.Job, models.Workspace, models.Plan
    counts = {
        (kind, str(tier)): n
        for kind, tier, n in session.execute(
            select(J.kind_id, P.tier, func.count())
            .join(W, W.id == J.workspace_id)
            .join(P, P.id == W.plan_id)
            .where(J.state == JobState.QUEUED.value)
            .group_by(J.kind_id, P.tier)
        ).all()
    }
    kinds = session.execute(select(models.JobKind.id)).scalars().all()
    tiers = session.execute(select(P.tier).distinct()).scalars().all()
    for kind in kinds:
        for tier in tiers:
            counts.setdefault((kind, str(tier)), 0)
    return counts
