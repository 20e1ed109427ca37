"""FAULT INJECTION for the local driver — a test hook, off unless its file exists.

``benchmarks/soak.py`` (the soak with chaos) makes the local "cloud" misbehave the way real
ones do, without a second driver: it writes ``<local root>/FAULT_INJECTION.json`` and the
driver reads it on every call. Without the file (every real use) nothing here does
anything. The file holds::

    {"until": <unix seconds>,     # faults apply until then (real time)
     "fail": 0.3,                 # a call fails before it reaches the host (Transient)
     "slow_s": 2.0,               # a call takes this many more real seconds
     "lose": 0.3,                 # a call takes effect, then its answer is lost (Transient)
     "ops": ["create", "destroy"],  # which calls (default: all)
     "probe_proxy": true}         # agents are reached through the soak's TCP proxies

Each call draws once; every fault injected is appended to ``FAULT_INJECTION.log`` (one
JSON line: time, call, fault) so the soak counts what really happened. ``probe_proxy``
makes the driver report an agent's address from ``disk/agent.proxy_port`` (the port of a
proxy the soak opened in front of the agent) instead of ``disk/agent.port``: cutting a
machine's probe path is then the soak's proxy holding every byte, as a partition would.
"""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path
from typing import Any, TypeVar

from gpufleet.common.provider_errors import Transient

log = logging.getLogger(__name__)

FAULTS_FILE = "FAULT_INJECTION.json"
FAULTS_LOG = "FAULT_INJECTION.log"
PROXY_PORT_FILE = "agent.proxy_port"
AGENT_PORT_FILE = "agent.port"

T = TypeVar("T")


class FaultInjection:
    """Reads the soak's fault file at every call; a no-op when there is none."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._random = random.Random()

    def _settings(self) -> dict[str, Any] | None:
        try:
            settings: dict[str, Any] = json.loads((self.root / FAULTS_FILE).read_text())
        except (OSError, ValueError):
            return None  # no file (every real use), or caught mid-write: no fault
        return settings

    def _active(self, op: str) -> dict[str, Any] | None:
        settings = self._settings()
        if settings is None or time.time() >= float(settings.get("until", 0)):
            return None
        ops = settings.get("ops")
        return settings if ops is None or op in ops else None

    def _record(self, op: str, fault: str) -> None:
        line = json.dumps({"t": time.time(), "op": op, "fault": fault})
        with (self.root / FAULTS_LOG).open("a") as handle:
            handle.write(line + "\n")
        log.warning("FAULT INJECTION: local driver %s: %s", op, fault)

    def before(self, op: str) -> None:
        """A slow or failed call, drawn before it touches the host."""
        settings = self._active(op)
        if settings is None:
            return
        slow = float(settings.get("slow_s", 0))
        if slow > 0:
            self._record(op, "slow")
            time.sleep(slow)  # the injected latency of a slow cloud API, on the caller's thread
        if self._random.random() < float(settings.get("fail", 0)):
            self._record(op, "fail")
            raise Transient(f"FAULT INJECTION: local driver {op} failed before it reached the host")

    def after(self, op: str, answer: T) -> T:
        """The call took effect; its answer may still be lost on the way back."""
        settings = self._active(op)
        if settings is not None and self._random.random() < float(settings.get("lose", 0)):
            self._record(op, "lose")
            raise Transient(f"FAULT INJECTION: local driver {op} took effect but its answer was lost")
        return answer

    def port_file(self) -> str:
        """Which file on a machine's disk names the port its agent is reached at."""
        settings = self._settings()
        return PROXY_PORT_FILE if settings is not None and settings.get("probe_proxy") else AGENT_PORT_FILE
