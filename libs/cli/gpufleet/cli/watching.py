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

# Real time between two looks: the CLI waits on the person's clock, not the system's.
DEFAULT_INTERVAL_S = 2.0


def _console(stream: object) -> Console:
    return Console(file=stream, highlight=False, markup=False, emoji=False)  # type: ignore[arg-type]


def watch(render: Callable[[], str], interval_s: float, stamp: Callable[[], datetime]) -> int:
    """Show ``render()`` every ``interval_s`` seconds until Ctrl-C (exit 0); a failing call
    ends the watch with its error, as the same command without --watch would."""
    pause = threading.Event()
    console = _console(sys.stdout)
    try:
        if console.is_terminal:
            with Live(console=console, auto_refresh=False, vertical_overflow="ellipsis") as live:
                while True:
                    header = f"every {interval_s:g}s, at {stamp():%H:%M:%S} (Ctrl-C stops)\n\n"
                    live.update(Text(header + render()), refresh=True)
                    pause.wait(interval_s)
        while True:
            print(f"--- {stamp():%Y-%m-%d %H:%M:%S}", flush=True)
            print(render(), flush=True)
            print(flush=True)
            pause.wait(interval_s)
    except KeyboardInterrupt:
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
