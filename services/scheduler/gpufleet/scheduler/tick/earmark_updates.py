"""What the films' moves do to each machine, decided once for every writer (issue 26: one
apply path).

Three writes touch a machine's earmark: a drain begun (a ready, unearmarked machine drains
for its film), a release (the earmark no longer serves its film: cleared, a draining
machine ready again) and a film started (the machine it starts on, and any other held for
it, is unearmarked, a draining one ready again). Each is a pure function from the machine
as read to an :class:`EarmarkUpdate` — or nothing, when the machine is no longer as the
decision assumed. The scheduler's SQL applier (:mod:`~gpufleet.scheduler.tick.earmarks`)
writes each update as one compare-and-set on what it read; the simulator applies the very
same updates to its machines.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from gpufleet.common.db.enums import MachineState
from gpufleet.scheduler.tick.model import Drain, Release

Action = Literal["drain", "earmark_released", "film_started"]


@dataclass(frozen=True)
class EarmarkRow:
    """A machine as the films' writes read it."""

    machine_id: str
    state: MachineState
    earmarked_for: str | None


@dataclass(frozen=True)
class EarmarkUpdate:
    """One machine's write, valid only while it is still as ``read``: a move to ``to``
    (None: it keeps its state) and its earmark set to ``earmark``."""

    read: EarmarkRow
    to: MachineState | None
    earmark: str | None
    why: str
    action: Action

    @property
    def after(self) -> EarmarkRow:
        return replace(self.read, state=self.to or self.read.state, earmarked_for=self.earmark)


def drain(row: EarmarkRow, d: Drain) -> EarmarkUpdate | None:
    """A ready machine no film holds drains for ``d``'s film (None: no longer ready or
    already held)."""
    if row.state is not MachineState.READY or row.earmarked_for is not None:
        return None
    why = f"draining for film {d.job_id}: its jobs end soonest (by {d.ends_at:%H:%M:%S} UTC)"
    return EarmarkUpdate(row, MachineState.DRAINING, d.job_id, why, "drain")


def release(row: EarmarkRow, job_id: str, why: str) -> EarmarkUpdate | None:
    """The machine is no longer held for ``job_id``'s film; a draining one is ready again
    (None: its earmark no longer names that film)."""
    if row.earmarked_for != job_id:
        return None
    to = MachineState.READY if row.state is MachineState.DRAINING else None
    return EarmarkUpdate(row, to, None, f"no longer drained for film {job_id}: {why}", "earmark_released")


def plan_updates(
    rows: Mapping[str, EarmarkRow], drains: Iterable[Drain], releases: Iterable[Release]
) -> list[EarmarkUpdate]:
    """A tick plan's earmark writes, in the order they apply: its releases, then its
    drains, each against the machine as the writes before it left it."""
    current = dict(rows)
    updates: list[EarmarkUpdate] = []

    def take(update: EarmarkUpdate | None) -> None:
        if update is not None:
            updates.append(update)
            current[update.read.machine_id] = update.after

    for r in releases:
        if (row := current.get(r.machine_id)) is not None:
            take(release(row, r.job_id, r.why))
    for d in drains:
        if (row := current.get(d.machine_id)) is not None:
            take(drain(row, d))
    return updates


def films_started(rows: Iterable[EarmarkRow], started: Mapping[str, str]) -> list[EarmarkUpdate]:
    """Films just assigned (job id → the machine it starts on): every machine held for one
    of them is unearmarked, a draining one ready again — the one it starts on has done its
    draining, any other is ordinary capacity at once."""
    updates = []
    for row in rows:
        job_id = row.earmarked_for
        if job_id is None or job_id not in started:
            continue
        where = started[job_id]
        why = f"film {job_id} started {'here' if where == row.machine_id else f'on machine {where}'}"
        to = MachineState.READY if row.state is MachineState.DRAINING else None
        updates.append(EarmarkUpdate(row, to, None, why, "film_started"))
    return updates
