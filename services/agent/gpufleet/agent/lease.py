"""An attempt's lease as the machine knows it: the ``lease`` file in its folder.

The worker writes it when it launches the attempt and again after every heartbeat the
scheduler acknowledged for it (not after one that named the attempt to cancel): the time
the renewal was asked for, on the machine's clock, and the lease the scheduler granted.
The attempt's runner reads it on every poll and stops its job once the fence has passed
(:func:`fenced`) — whether the control plane cannot be reached, or the worker is dead or
paused: either way nobody renews it, and the control plane is about to run the job
elsewhere (gpufleet.common.lease_fence says why the fence is early enough).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet.agent.statedir import AttemptFiles, atomic_write_json
from gpufleet.common.lease_fence import runner_fence_s


@dataclass(frozen=True)
class Renewal:
    """The attempt's last renewal: asked for at ``at`` (machine clock), for ``lease_s``."""

    at: datetime
    lease_s: float

    @property
    def fence_at(self) -> datetime:
        """When the runner must begin stopping the job unless renewed again."""
        return self.at + timedelta(seconds=runner_fence_s(self.lease_s))


def renew(files: AttemptFiles, at: datetime, lease_s: float) -> None:
    """Record a renewal; never moves the attempt's renewal backwards."""
    current = read_renewal(files)
    if current is not None and current.at >= at:
        return
    atomic_write_json(files.lease, {"renewed_at": at.isoformat(), "lease_s": lease_s})


def read_renewal(files: AttemptFiles) -> Renewal | None:
    """The attempt's last renewal; None when its folder has none (an attempt launched by
    a worker that kept no lease file) or it cannot be read."""
    try:
        doc = json.loads(files.lease.read_text(encoding="utf-8"))
        return Renewal(datetime.fromisoformat(str(doc["renewed_at"])), float(doc["lease_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fenced(now: datetime, renewal: Renewal | None) -> bool:
    """Whether the job must stop now: its lease went unrenewed past the fence."""
    return renewal is not None and renewal.lease_s > 0 and now >= renewal.fence_at
