"""SIGTERM and SIGINT, handled without taking a lock inside the handler.

A Python signal handler runs in the main thread between two bytecodes — possibly while
that thread holds a lock: the one inside ``Event.wait`` it is polling, or a logging
handler's. A handler that calls ``Event.set()`` or logs can then wait forever on a lock
its own thread holds (``gpufleet up`` was seen ignoring SIGTERM that way). Here the
handler only writes the signal's number to a pipe (async-signal-safe, no lock); a thread
of its own reads it and runs the callback, in an ordinary thread's context.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def on_signals(callback: Callable[[int], None], signals: Iterable[signal.Signals] = STOP_SIGNALS) -> None:
    """Call ``callback(signum)`` on a thread of its own each time one of ``signals`` arrives.
    Must be called from the main thread (where handlers are installed)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)

    def handler(signum: int, _frame: object) -> None:
        with contextlib.suppress(BlockingIOError):  # a full pipe already holds a pending stop
            os.write(write_fd, bytes([signum]))

    def relay() -> None:
        while True:
            got = os.read(read_fd, 1)
            if not got:
                return
            callback(got[0])

    threading.Thread(target=relay, name="signals", daemon=True).start()
    for sig in signals:
        signal.signal(sig, handler)


def stop_on_signals(stop: threading.Event, log: Callable[[str], None] | None = None) -> None:
    """Set ``stop`` when SIGTERM or SIGINT arrives (logging which, when given a logger)."""

    def stopping(signum: int) -> None:
        if log is not None:
            log(f"received signal {signal.Signals(signum).name}; stopping")
        stop.set()

    on_signals(stopping)
