"""Views that go on: ``jobs --watch`` / ``machines --watch`` and a drain's progress.

On a terminal they redraw in place (rich's Live and Status: the cursor moves, resizes and a
view taller than the screen are rich's to get right). Into a pipe or a file each refresh is
appended instead — a table with the time above it, a progress line when it changes — so a
log of a watch reads top to bottom.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime

from rich.console import Console
from rich.live import Live
from rich.status import Status
from rich.text import Text

from gpufleet.common.signals import stop_on_signals

# Real time between two looks: the CLI waits on the person's clock, not the system's.
DEFAULT_INTERVAL_S = 2.0


def _console(stream: object) -> Console:
    return Console(file=stream, highlight=False, markup=False, emoji=False)  # type: ignore[arg-type]


def watch(render: Callable[[], str], interval_s: float, stamp: Callable[[], datetime]) -> int:
    """Show ``render()`` every ``interval_s`` seconds until Ctrl-C or SIGTERM (exit 0); a
    failing call ends the watch with its error, as the same command without --watch would.

    The signals set an event (:func:`gpufleet.common.signals.stop_on_signals`) instead of
    raising in the middle of a call: a watch started in the background, where SIGINT starts
    out ignored and Python would never raise KeyboardInterrupt, stops all the same, and a
    look in flight ends before the watch does."""
    stop = threading.Event()
    stop_on_signals(stop)
    console = _console(sys.stdout)
    try:
        if console.is_terminal:
            with Live(console=console, auto_refresh=False, vertical_overflow="ellipsis") as live:
                while not stop.is_set():
                    header = f"every {interval_s:g}s, at {stamp():%H:%M:%S} (Ctrl-C stops)\n\n"
                    live.update(Text(header + render()), refresh=True)
                    stop.wait(interval_s)
            return 0
        while not stop.is_set():
            print(f"--- {stamp():%Y-%m-%d %H:%M:%S}", flush=True)
            print(render(), flush=True)
            print(flush=True)
            stop.wait(interval_s)
    except KeyboardInterrupt:  # a signal that came before the handlers were in place
        pass
    return 0


@contextlib.contextmanager
def progress(first: str) -> Iterator[Callable[[str], None]]:
    """A line that says how a wait goes, on stderr: a spinner redrawn in place on a
    terminal, else the line again each time it changes. Yields the function that updates it."""
    console = _console(sys.stderr)
    if console.is_terminal:
        with Status(first, console=console) as status:
            yield lambda text: status.update(text)
        return
    last = [""]

    def say(text: str) -> None:
        if text != last[0]:
            last[0] = text
            print(text, file=sys.stderr, flush=True)

    say(first)
    yield say
