"""Which catalogue offerings the provisioner serves: read by the no-consumer detector
(outside the tick, over the network), used by the fleet tick's scale step (never creating
from an offering no driver serves) without a call of its own."""

from __future__ import annotations

import threading


class ServedOfferings:
    """The offerings the provisioner serves, as last read; shared with the fleet tick."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: frozenset[str] | None = None

    def get(self) -> frozenset[str] | None:
        with self._lock:
            return self._ids

    def set(self, ids: set[str]) -> None:
        with self._lock:
            self._ids = frozenset(ids)
