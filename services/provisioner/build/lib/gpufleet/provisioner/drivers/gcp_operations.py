"""Waiting for a Compute Engine zone operation, bounded, without sleeping.

An insert, start, stop or delete answers at once with an operation; whether it worked is
known only when the operation is ``DONE``. :class:`OperationWaiter` asks the operation
again until it is, holding each poll server-side (``zoneOperations.wait`` returns as soon
as the operation is done, or after a while) — so no loop here sleeps — and gives up with
:class:`NotYetDone` once the bound has passed:

- on the injected clock: ``wait_s`` of the clock's time (the logic's bound);
- in real time: ``clock.real_seconds(wait_s)``, measured on an injected monotonic source,
  so a provider call can never outlive the gRPC deadline of its caller, even on a clock
  that a test holds still. Each poll holds at most ``poll_s`` and never past that end.

The SDK's own extended-operation poller is not used: it ignores a custom endpoint and has
no bound of ours.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from gpufleet.common.clock import Clock
from gpufleet.common.provider_errors import NotYetDone

__all__ = ["OperationWaiter", "Poll", "is_done"]

_DONE = "DONE"


class Poll(Protocol):
    def __call__(self, zone: str, operation: str, hold_s: float) -> Any | None:
        """The operation now, held server-side up to ``hold_s`` real seconds; None when
        the poll got no usable answer in time (a timeout, throttling, a 5xx)."""
        ...


def is_done(op: Any) -> bool:
    """Whether a ``compute_v1.Operation`` (status is an enum) has finished."""
    status = op.status
    return bool(getattr(status, "name", status) == _DONE)


class OperationWaiter:
    """Waits for one operation at a time; see the module docstring for the bound."""

    def __init__(
        self,
        poll: Poll,
        clock: Clock,
        *,
        wait_s: float,
        poll_s: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.poll = poll
        self.clock = clock
        self.wait_s = wait_s
        self.poll_s = poll_s
        self.monotonic = monotonic

    def wait(self, op: Any, zone: str, what: str) -> Any:
        """The finished operation (which may carry errors: the caller classifies them).

        Raises NotYetDone when it is still pending or running at the bound.
        """
        deadline = self.clock.now() + timedelta(seconds=self.wait_s)
        real_end = self.monotonic() + self.clock.real_seconds(self.wait_s)
        polls = 0
        while not is_done(op):
            real_left = real_end - self.monotonic()
            if self.clock.now() >= deadline or real_left <= 0:
                status = getattr(op.status, "name", op.status)
                raise NotYetDone(
                    f"{what}: operation {op.name} in {zone} still {status} after {self.wait_s:g}s "
                    f"({polls} polls); its outcome is unknown"
                )
            polls += 1
            op = self.poll(zone, op.name, min(self.poll_s, real_left)) or op
        return op
