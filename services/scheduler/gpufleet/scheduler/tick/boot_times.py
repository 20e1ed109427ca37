"""How long machines take to boot, as the leader's fleet tick has seen them do it.

A job waiting for a machine on its way is told when that machine is expected to take work:
when it began arriving plus its offering's typical boot. The catalogue has no boot time,
and the store keeps no history of one, so the leader learns it from what each tick reads:
a machine seen PROVISIONING or STARTING began arriving at that state's change (the request
to the provider); seen later READY, its boot is its READY change minus that. The typical
boot of an offering is the median of its last few, so one slow machine does not move every
waiting job's estimate. A new leader starts with nothing and uses the policy's default
until a machine boots under it; a machine it first sees already BOOTING is taken to have
begun at that change (a little late: the provider's call is not counted).

Kept in memory only, like :class:`~gpufleet.scheduler.tick.snapshot.LiveAttempts`: nothing
is read or written for it.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable
from datetime import datetime

from gpufleet.common.db.enums import MachineState
from gpufleet.scheduler.tick.model import MachineView

_REQUESTED = frozenset({MachineState.PROVISIONING.value, MachineState.STARTING.value})
_BOOTING = MachineState.BOOTING.value
_READY = MachineState.READY.value
# Boots kept per offering.
KEEP = 16


class BootTimes:
    def __init__(self, keep: int = KEEP) -> None:
        self._began: dict[str, datetime] = {}
        self._boots: dict[str, deque[float]] = {}
        self._keep = keep

    def saw(self, machines: Iterable[MachineView]) -> None:
        """One tick's machines: arrivals begun, boots ended."""
        began: dict[str, datetime] = {}
        for m in machines:
            if m.state_changed_at is None:
                continue
            if m.state in _REQUESTED:
                began[m.id] = m.state_changed_at
            elif m.state == _BOOTING:
                began[m.id] = self._began.get(m.id, m.state_changed_at)
            elif m.state == _READY and m.offering_id is not None and (start := self._began.get(m.id)):
                boot = (m.state_changed_at - start).total_seconds()
                if boot > 0:
                    self._boots.setdefault(m.offering_id, deque(maxlen=self._keep)).append(boot)
        self._began = began

    def arriving_since(self) -> dict[str, datetime]:
        """When each machine on its way began arriving."""
        return dict(self._began)

    def typical_s(self) -> dict[str, float]:
        """Each offering's typical boot in seconds (those seen boot only)."""
        return {offering: statistics.median(boots) for offering, boots in self._boots.items()}
