"""The idle chain's timers the scheduler takes off: a machine given work, or a stopped machine
started for work, no longer waits to be stopped or destroyed (DESIGN §4).

The reaper's idle scanner arms a machine's ``stop_due_at`` and ``destroy_due_at`` and clears
them when it sees traffic; the scheduler clears them too, in the transactions that assign
work or start a machine. Each machine that had a timer set is counted ``cleared`` in
``gpufleet.reaper.idle.timers`` once that transaction has committed, so the scanner's
``armed`` is matched by a ``cleared`` whichever service took the timers off. A machine
whose timers were not set (the usual case: it was busy) is not counted: its clear took
nothing off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from sqlalchemy import Connection, Table, select, update

from gpufleet.common.db import models
from gpufleet.common.db.bulk import among
from gpufleet.common.idle_timers import CLEARED
from gpufleet.common.metrics.catalog import REAPER_IDLE_TIMERS
from gpufleet.common.metrics.instruments import Instruments

_MACHINES = cast(Table, models.Machine.__table__)
# Machines per statement: well under every driver's parameter limit.
_CHUNK = 2000


class IdleTimerClears:
    """The ``cleared`` count of the machines whose timers a committed transaction took off."""

    def __init__(self, instruments: Instruments) -> None:
        self._timers = instruments.counter(REAPER_IDLE_TIMERS)

    def committed(self, machines: int) -> None:
        if machines:
            self._timers.add(machines, {"action": "cleared"})


def clear_for_work(conn: Connection, machine_ids: Sequence[str]) -> int:
    """Clear both idle timers of ``machine_ids``, in the caller's transaction; returns how
    many of them had one set.

    The rows are locked and read first, with no condition on the timers: an arm committing
    at the same moment is waited for and read, so it is counted as the clear that follows
    takes it off. The clear itself has no condition either (work assigned clears both
    timers, whatever the scan saw)."""
    dialect = conn.dialect.name
    had_timers = 0
    ids = sorted(set(machine_ids))
    for start in range(0, len(ids), _CHUNK):
        part = ids[start : start + _CHUNK]
        timers = conn.execute(
            select(_MACHINES.c.stop_due_at, _MACHINES.c.destroy_due_at)
            .where(among(_MACHINES.c.id, part, dialect))
            .order_by(_MACHINES.c.id)
            .with_for_update()
        ).all()
        had_timers += sum(1 for stop, destroy in timers if stop is not None or destroy is not None)
        conn.execute(update(_MACHINES).where(among(_MACHINES.c.id, part, dialect)).values(**CLEARED))
    return had_timers
