"""The agent's dead-man switch: an idle machine whose control plane has gone quiet stops
itself, so a control plane that vanished cannot leave GPUs billing.

The decision is pure (:func:`decide`): stop only when the machine holds no attempt (none
running, none waiting in the inbox) **and** no control-plane identity has called the agent
for ``after`` (default 30 min; a live reaper samples every running machine every 30 s).
A running attempt always wins: silence during a job is the job's business, and its lease
says what the control plane thinks of it. The act (:class:`DeadManSwitch`) first leaves a
marker on the machine's disk — which the provider's view of the instance reports, so the
sweeper records the stop as the machine's own and not as a pre-emption — then stops the
machine through its own OS: on a cloud image ``shutdown -h now``; a local machine (one
session of processes on a development host) ends its session.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

from gpufleet.common.clock import Clock

log = logging.getLogger(__name__)

# Written on the machine's disk just before it stops itself; read by the local driver (and
# kept with the disk). Its text is the time and the reason.
MARKER = "stopped_by_itself"

Action = Literal["off", "shutdown", "session"]


class Verdict(enum.Enum):
    STOP = "stop"
    BUSY = "busy"  # an attempt holds the machine: never
    HEARD_RECENTLY = "heard_recently"
    OFF = "off"


@dataclass(frozen=True)
class Policy:
    after: timedelta
    action: Action


def decide(now: datetime, last_heard: datetime, busy: bool, policy: Policy) -> Verdict:
    """Stop an idle machine nobody has spoken to for ``policy.after``."""
    if policy.action == "off":
        return Verdict.OFF
    if busy:
        return Verdict.BUSY
    if now - last_heard < policy.after:
        return Verdict.HEARD_RECENTLY
    return Verdict.STOP


class Contact:
    """When a control-plane identity last called this agent (every AgentService method is
    open to the scheduler and the reaper only). Starts at the agent's start, so a new or
    restarted agent gets the whole window."""

    def __init__(self, now: datetime) -> None:
        self._lock = threading.Lock()
        self._last = now

    def heard(self, now: datetime) -> None:
        with self._lock:
            self._last = max(self._last, now)

    def last(self) -> datetime:
        with self._lock:
            return self._last


def end_own_session() -> None:
    """A local machine is one session of processes (the agent is its leader): end all of
    them, this one last."""
    sid = os.getsid(0)
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError, ValueError):
            # "pid (comm) state ppid pgrp session ..."; comm may hold spaces and parentheses.
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
            if int(fields[3]) == sid:
                os.kill(int(entry.name), signal.SIGKILL)
    os.kill(me, signal.SIGKILL)


def shutdown_host() -> None:
    """A cloud machine: the OS halts; the provider stops billing the GPU (its disk kept)."""
    subprocess.run(["shutdown", "-h", "now"], check=False, timeout=60)


class DeadManSwitch:
    """Looks every ``every`` (real seconds) and acts at most once."""

    def __init__(
        self,
        clock: Clock,
        contact: Contact,
        busy: Callable[[], bool],
        policy: Policy,
        marker_dir: Path,
        act: Callable[[], None] | None = None,
    ) -> None:
        self.clock = clock
        self.contact = contact
        self.busy = busy
        self.policy = policy
        self.marker = marker_dir / MARKER
        self.act = act or (shutdown_host if policy.action == "shutdown" else end_own_session)

    def check(self) -> Verdict:
        now = self.clock.now()
        verdict = decide(now, self.contact.last(), self.busy(), self.policy)
        if verdict is Verdict.STOP:
            quiet = now - self.contact.last()
            reason = (
                f"idle and no control-plane call for {quiet.total_seconds() / 60:.0f} min "
                f"(the limit is {self.policy.after.total_seconds() / 60:.0f} min): stopping this machine "
                f"({self.policy.action})"
            )
            log.warning("dead-man switch: %s", reason, extra={"fields": {"dead_man": "stop"}})
            self.marker.write_text(f"{now.isoformat()} {reason}\n")
            self.act()
        return verdict

    def run(self, stop: threading.Event, every_s: float) -> None:
        while not stop.wait(every_s):
            try:
                if self.check() is Verdict.STOP:
                    return
            except Exception:  # the switch must never take the agent down by accident
                log.exception("dead-man switch check failed")
