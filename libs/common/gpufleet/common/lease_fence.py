"""The machine's side of an attempt's lease: the fence, and the margin that keeps it
ahead of the control plane (docs/leases.md).

The scheduler grants an attempt a lease of ``attempt_lease_s`` at dispatch and again at
every worker heartbeat that names it; a lease that runs out ends the attempt LOST and its
job is queued again — possibly onto another machine at once. The job's first process must
be gone by then, or one job runs twice at the same time. So the machine fences itself:
the attempt's runner stops its job when the lease has not been renewed for
:func:`runner_fence_s` of the granted lease, measured on the machine's own clock from the
worker's last acknowledged renewal.

Both sides measure a duration on their own clock from their own instant, and the
machine's instant (the heartbeat's send, or the job's launch) comes no later than the
scheduler's (the heartbeat's receipt, or the dispatch), so neither clock's offset
matters. The rest of the lease — the *margin*, :func:`margin_s` — covers:

* the hand-off of the first lease: the scheduler starts it at dispatch, the machine at
  launch, up to ``dispatch_deadline_s`` later (a StartJob not answered by then is taken
  back, and then cancelled on the machine);
* the stop itself: the job's SIGTERM grace, capped at :data:`STOP_SHARE` of the margin
  (:func:`fenced_grace_cap_s`), and the runner's poll;
* the two clocks' rates, which differ by parts per million.

The scheduler refuses a configuration whose margin cannot hold the hand-off and the stop
(:func:`lease_violation`), so the fence is kept by construction on every deployment.
"""

from __future__ import annotations

# The runner stops its job this share of the way into a lease that was not renewed.
FENCE_SHARE = 0.5
# At most this share of the margin goes to a fenced job's SIGTERM grace; the rest is for
# the first lease's hand-off and the runner's poll.
STOP_SHARE = 0.25


def runner_fence_s(granted_lease_s: float) -> float:
    """Clock seconds after a renewal at which the runner begins to stop its job."""
    if granted_lease_s <= 0:
        raise ValueError(f"a granted lease must be positive, not {granted_lease_s!r}")
    return granted_lease_s * FENCE_SHARE


def margin_s(granted_lease_s: float) -> float:
    """Clock seconds by which the control plane's lease outlasts the runner's fence."""
    return granted_lease_s - runner_fence_s(granted_lease_s)


def fenced_grace_cap_s(granted_lease_s: float) -> float:
    """The longest SIGTERM grace a job stopped by the fence is given, in clock seconds:
    :data:`STOP_SHARE` of the margin. The runner gives the smaller of this (in real
    seconds, through its clock) and its configured grace — a sped-up clock turns a 5 s
    real grace into minutes of clock time."""
    return margin_s(granted_lease_s) * STOP_SHARE


def lease_violation(attempt_lease_s: float, dispatch_deadline_s: float) -> str | None:
    """Why a scheduler's lease would let a fenced machine outlive it (None: it cannot).

    The machine counts the first lease from the job's launch, which comes up to
    ``dispatch_deadline_s`` after the scheduler started it; that hand-off and the fenced
    stop's grace must both fit in the margin.
    """
    margin = margin_s(attempt_lease_s)
    room = margin * (1 - STOP_SHARE)
    if dispatch_deadline_s >= room:
        return (
            f"attempt_lease_s={attempt_lease_s:g} leaves machines a margin of {margin:g} s past their "
            f"fence ({FENCE_SHARE:g} of the lease), of which {room:g} s may cover the first lease's "
            f"hand-off; dispatch_deadline_s={dispatch_deadline_s:g} does not fit in it, so a machine "
            f"could still run a job the scheduler has already declared lost. Raise attempt_lease_s "
            f"above {dispatch_deadline_s / (1 - FENCE_SHARE) / (1 - STOP_SHARE):g} or lower "
            f"dispatch_deadline_s"
        )
    return None
