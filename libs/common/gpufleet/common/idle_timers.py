"""A machine's two idle timers, ``stop_due_at`` and ``destroy_due_at`` (DESIGN §4, the money
chain): armed together by the reaper's idle scanner when a machine is quiet, and cleared
together — unconditionally — when traffic is seen (the scanner) or work is assigned (the
fleet tick's assign commit). :data:`CLEARED` is that one update, written by both services'
SQL and applied by the simulator (issue 26: one apply path).
"""

from __future__ import annotations

from datetime import datetime
from types import MappingProxyType
from typing import Final

CLEARED: Final = MappingProxyType[str, datetime | None]({"stop_due_at": None, "destroy_due_at": None})
