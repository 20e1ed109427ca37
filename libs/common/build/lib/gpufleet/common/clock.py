"""Injected time for every gpufleet process.

Nothing in gpufleet's logic reads ``datetime.now()`` or calls ``time.sleep()``: it asks a
``Clock``. Production uses :class:`RealClock`; unit tests use :class:`ManualClock` and
advance it; the demo uses :class:`ScaledClock`, a real clock sped up by a factor that every
process shares (same origin, same speed), so a 15-minute threshold passes in seconds while
gRPC, processes and the database stay real; integration tests that drive several real
processes use :class:`FileClock`, a manual clock whose reading lives in a file they all see.
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Protocol

__all__ = [
    "Clock",
    "FileClock",
    "ManualClock",
    "RealClock",
    "ScaledClock",
    "clock_from_spec",
]


class Clock(Protocol):
    """A source of time that loops can also wait on."""

    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""
        ...

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        """Wait ``seconds`` of this clock's time; return True early if ``stop`` is set."""
        ...

    def real_seconds(self, seconds: float) -> float:
        """How many wall-clock seconds ``seconds`` of this clock's time takes (for deadlines)."""
        ...


class RealClock:
    """Wall-clock time."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        return stop.wait(max(0.0, seconds))

    def real_seconds(self, seconds: float) -> float:
        return seconds


class ScaledClock:
    """Real time sped up by ``speed`` from a shared ``origin`` (unix seconds).

    Every process given the same origin and speed reads the same virtual time, so the
    demo's services agree on when a timer falls due.
    """

    def __init__(self, speed: float, origin: float | None = None) -> None:
        if speed <= 0:
            raise ValueError("clock speed must be positive")
        self.speed = speed
        self.origin = time.time() if origin is None else origin

    def now(self) -> datetime:
        real = time.time()
        virtual = self.origin + (real - self.origin) * self.speed
        return datetime.fromtimestamp(virtual, UTC)

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        return stop.wait(max(0.0, seconds) / self.speed)

    def real_seconds(self, seconds: float) -> float:
        return seconds / self.speed


class ManualClock:
    """A clock that moves only when a test advances it; waiters wake when it does."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._changed = threading.Condition()

    def now(self) -> datetime:
        with self._changed:
            return self._now

    def advance(self, delta: timedelta | float) -> datetime:
        """Move time forward and wake every waiter; returns the new time."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError("a clock never goes backwards")
        with self._changed:
            self._now += step
            self._changed.notify_all()
            return self._now

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        with self._changed:
            target = self._now + timedelta(seconds=max(0.0, seconds))
            while self._now < target:
                if stop.is_set():
                    return True
                # Poll stop too: a test that sets it without advancing must not hang us.
                self._changed.wait(timeout=0.05)
        return stop.is_set()

    def real_seconds(self, seconds: float) -> float:
        return 0.05


class FileClock:
    """A manual clock shared by several processes through a file holding unix seconds.

    The test that owns the file advances it (:meth:`advance`); every process reading it
    sees the same time. Waiting polls the file, so a loop wakes shortly after a jump.
    """

    poll_seconds = 0.02

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, path: Path | str, start: datetime) -> FileClock:
        clock = cls(path)
        clock._write(start.timestamp())
        return clock

    def _read(self) -> float:
        for _ in range(50):
            text = self.path.read_text().strip()
            if text:
                return float(text)
            time.sleep(0.001)  # a writer is mid-rename; real time is right here
        raise RuntimeError(f"clock file {self.path} is empty")

    def _write(self, value: float) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(repr(value))
        os.replace(tmp, self.path)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._read(), UTC)

    def advance(self, delta: timedelta | float) -> datetime:
        step = delta.total_seconds() if isinstance(delta, timedelta) else float(delta)
        if step < 0:
            raise ValueError("a clock never goes backwards")
        value = self._read() + step
        self._write(value)
        return datetime.fromtimestamp(value, UTC)

    def wait(self, seconds: float, stop: threading.Event) -> bool:
        target = self._read() + max(0.0, seconds)
        while self._read() < target:
            if stop.wait(self.poll_seconds):
                return True
        return stop.is_set()

    def real_seconds(self, seconds: float) -> float:
        return 0.5


def clock_from_spec(
    kind: str, speed: float = 1.0, origin: float | None = None, path: str | None = None
) -> Clock:
    """Build the clock a process's settings ask for (``real``, ``scaled`` or ``file``)."""
    if kind == "real":
        return RealClock()
    if kind == "scaled":
        return ScaledClock(speed=speed, origin=origin)
    if kind == "file":
        if not path:
            raise ValueError("GPUFLEET_CLOCK=file needs GPUFLEET_CLOCK_FILE")
        return FileClock(path)
    raise ValueError(f"unknown clock {kind!r}: expected real, scaled or file")
