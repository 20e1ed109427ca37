"""A spot machine's history as the scale step prices it: its pre-emptions over the hours
its spot instances ran (``tick/decide.py``'s expected cost). Two writers add to the hours
— the reaper when it claims a running spot machine for a stop or destroy, the sweeper when
the cloud took one back — and the simulator applies the same rule. This module is that
rule, so the hours the simulator's scale step reads are the hours production's reads."""

from __future__ import annotations

from datetime import datetime

from gpufleet.common.db.enums import RUNNING_STATES

_RUNNING = frozenset(s.value for s in RUNNING_STATES)


def ran_s(first_observed_at: datetime | None, now: datetime) -> float:
    """How long the machine has run this life: since this platform first saw it running
    (0 when it never did)."""
    if first_observed_at is None:
        return 0.0
    return max(0.0, (now - first_observed_at).total_seconds())


def claimed_s(spot: bool, state: str, first_observed_at: datetime | None, now: datetime) -> float:
    """The spot seconds a stop or destroy adds as it claims the machine: its run this life
    when it is a spot machine still running (0 for anything else), so that the pre-emption
    rate is pre-emptions over all spot hours, not only over the hours that ended in one."""
    if not spot or state not in _RUNNING:
        return 0.0
    return ran_s(first_observed_at, now)
