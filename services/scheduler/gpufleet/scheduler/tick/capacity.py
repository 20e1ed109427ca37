"""Free slots indexed so that one tick's assignment grows with jobs plus machines.

The old ``assign()`` scanned every machine for every job (15 M fit checks at 10k jobs and
2k machines). Here each pool keeps one heap per free-slot count, ordered by price and id,
plus one heap of wholly free machines for films; a pick walks at most the pool's slot
counts. Entries are dropped lazily: an entry whose machine no longer has that many free
slots is stale and popped when met. Counts only go down within a tick, so a machine is
never pushed twice onto the same heap.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable

from gpufleet.scheduler.tick.model import JobView, MachineView


class FreeCapacity:
    """The free slots of the machines that may take work this tick."""

    def __init__(self, machines: Iterable[MachineView]) -> None:
        self._free: dict[str, list[int]] = {}
        self._machine: dict[str, MachineView] = {}
        self._by_count: dict[str, dict[int, list[tuple[int, str]]]] = defaultdict(dict)
        self._whole: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
        self._max_slots: dict[str, int] = defaultdict(int)
        for m in machines:
            pool = m.pool_id
            if pool is None:
                continue
            busy = m.busy_slots
            # ``m.free_slots``, written out: this runs for every machine with room, every tick.
            free = [s for s in range(m.slots) if s not in busy] if busy else list(range(m.slots))
            if not free:
                continue  # full machines are never looked at again
            self._free[m.id] = free
            self._machine[m.id] = m
            if m.slots > self._max_slots[pool]:
                self._max_slots[pool] = m.slots
            heapq.heappush(self._by_count[pool].setdefault(len(free), []), (m.hourly_price_micros, m.id))
            if len(free) == m.slots:
                self._whole[pool].append((m.slots, m.hourly_price_micros, m.id))
        for heap in self._whole.values():
            heapq.heapify(heap)

    def _push(self, m: MachineView, count: int) -> None:
        assert m.pool_id is not None
        heapq.heappush(self._by_count[m.pool_id].setdefault(count, []), (m.hourly_price_micros, m.id))

    def take(self, job: JobView) -> tuple[str, tuple[int, ...]] | None:
        """The machine and slots ``job`` gets — the fullest machine that fits it (packing
        busy machines first so the others go quiet), then the cheapest, then by id — or
        None when nothing in its pool fits. The slots are taken at once."""
        chosen = self._whole_machine(job.pool_id) if job.whole_machine else self._fullest(job)
        if chosen is None:
            return None
        machine = self._machine[chosen]
        free = self._free[chosen]
        n = machine.slots if job.whole_machine else job.slots_needed
        taken, rest = tuple(free[:n]), free[n:]
        self._free[chosen] = rest
        if rest:
            self._push(machine, len(rest))
        return chosen, taken

    def _fullest(self, job: JobView) -> str | None:
        counts = self._by_count.get(job.pool_id)
        if not counts:
            return None
        best: tuple[int, int, str] | None = None
        for count in range(max(job.slots_needed, 1), self._max_slots[job.pool_id] + 1):
            heap = counts.get(count)
            while heap and len(self._free[heap[0][1]]) != count:
                heapq.heappop(heap)  # stale: the machine has fewer free slots now
            if heap:
                best = (count, *heap[0])
                heapq.heappop(heap)
                break
        return best[2] if best else None

    def _whole_machine(self, pool_id: str) -> str | None:
        heap = self._whole.get(pool_id)
        while heap:
            slots, _price, mid = heapq.heappop(heap)
            if len(self._free[mid]) == slots:
                return mid
        return None
