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
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """No restart after this returns (a restart in progress is waited for): the
        teardown stops the services next, and one started behind its back would live on."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30.0)

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
                if self._stop.wait(self.restart_after_s):
                    return
                self.stack.spawn(name)
