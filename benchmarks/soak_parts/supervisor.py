"""What restarts a process the chaos killed, as the platform around gpufleet would.

- **Control-plane services**: Kubernetes restarts a container that exited. Every exit is
  restarted after ``restart_after_s``; one the chaos caused is counted as a restart, any
  other as an *unexpected exit* (with the tail of its log), which the soak reports apart:
  a service that dies of a database restart is a finding, not chaos.

A machine's agent daemon is restarted inside the machine, by systemd's stand-in
(agent_unit.py), not here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.cli.stack import Stack


@dataclass
class Supervisor:
    stack: Stack
    machines_root: Path
    restart_after_s: float = 1.0
    service_restarts: int = 0
    unexpected_exits: list[tuple[str, int, str]] = field(default_factory=list)
    _expected: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._loop, name="supervisor", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def expect_exit(self, service: str) -> None:
        with self._lock:
            self._expected.add(service)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            for name, proc in list(self.stack.processes.items()):
                code = proc.poll()
                if code is None:
                    continue
                with self._lock:
                    expected = name in self._expected
                    self._expected.discard(name)
                if expected:
                    self.service_restarts += 1
                else:
                    log = self.stack.config.state_dir / "logs" / f"{name}.log"
                    tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
                    self.unexpected_exits.append((name, code, tail))
                time.sleep(self.restart_after_s)
                self.stack.spawn(name)
