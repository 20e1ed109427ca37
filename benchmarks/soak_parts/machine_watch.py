"""The store's view of every machine, read once a second while the soak runs: when each
was marked lost, cordoned, stopped or destroyed. A net's act can be undone later (a lost
machine is unmarked when it answers again), so the end state alone cannot say whether a
fault was caught in time; this history can. A read that fails (PostgreSQL restarting) is
skipped."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select

from gpufleet.common.db import models

# A machine in one of these, or marked lost or cordoned, is out of service: acted on.
OUT_OF_SERVICE = frozenset({"STOPPING", "STOPPED", "DESTROYING", "DESTROYED"})
# The states the lost and went-silent nets watch (a machine still booting is the boot
# nets', whose deadlines are far longer).
IN_SERVICE = frozenset({"READY", "DRAINING"})


@dataclass
class MachineWatch:
    sessions: Any
    clock_now: Any  # () -> the control plane's time, unix seconds
    every_s: float = 1.0
    # machine id -> [(control-plane time, state, lost, cordoned)] on every change
    history: dict[str, list[tuple[float, str, bool, bool]]] = field(default_factory=dict)
    reads: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._loop, name="machine-watch", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.read()
            except Exception:  # the database is away: next second
                continue

    def read(self) -> None:
        now = self.clock_now()
        with self.sessions() as session:
            rows = session.execute(
                select(models.Machine.id, models.Machine.state, models.Machine.lost, models.Machine.cordoned)
            ).all()
        for machine_id, state, lost, cordoned in rows:
            seen = self.history.setdefault(machine_id, [])
            if not seen or seen[-1][1:] != (state, lost, cordoned):
                seen.append((now, state, bool(lost), bool(cordoned)))
        self.reads += 1

    def state_at(self, machine_id: str, t: float) -> tuple[str, bool, bool] | None:
        """The machine's (state, lost, cordoned) as last read at or before ``t`` (the
        control plane's clock); None when it had not been read by then. A change shows up
        here up to one read (``every_s``, real) after it happened."""
        found = None
        for at, state, lost, cordoned in self.history.get(machine_id, []):
            if at > t:
                break
            found = (state, lost, cordoned)
        return found

    def acted_at(self, machine_id: str, since: float) -> float | None:
        """The first time at or after ``since`` the machine was seen out of service (``since``
        itself when it already was)."""
        before = None
        for at, state, lost, cordoned in self.history.get(machine_id, []):
            out = lost or cordoned or state in OUT_OF_SERVICE
            if at < since:
                before = out
            elif out:
                return since if before else at
        return since if before else None
