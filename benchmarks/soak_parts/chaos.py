"""The chaos driver: at random (seeded), one fault after another, every class in turn in a
shuffled order, with random gaps, targets and durations.

Classes (``FAULT_CLASSES``):

- ``kill_agent`` — SIGKILL a machine's agent daemon; systemd's stand-in on the machine
  (agent_unit.py) starts it again after 2 s. Shorter than every threshold: nothing may be
  destroyed.
- ``kill_worker`` — SIGKILL a machine's worker. Nothing brings it back (by design, the
  agent never resurrects it): its heartbeats stop, its attempts' leases run out, and the
  went-silent net must destroy the machine within its threshold plus one cadence.
- ``kill_runner`` — SIGKILL the runner of a live attempt (its job process lives on).
- ``kill_service`` — SIGKILL a control-plane service; the supervisor restarts it.
- ``pause_agent`` — SIGSTOP a machine's agent for a while, then SIGCONT.
- ``cut_probe_path`` — hold every byte to and from a machine's agent for a while.
  For both: either shorter than the lost detector's threshold (nothing may happen) or
  longer than threshold plus cadence (the machine must be marked lost in that time).
- ``provider_faults`` — a window in which the local cloud's calls fail, slow down or
  lose their answers (the local driver's FAULT INJECTION hook); what it really injected
  is read back from its log.
- ``restart_postgres`` — PostgreSQL stopped immediately (a crash or failover) and started
  again after 1-12 s.
- ``gpu_fault`` — an Xid/ECC fault in the fake NVML (needs the GPU-health work).

A class whose piece has not landed stays in the list and is skipped with a line saying why.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.soak_parts.probe_proxy import ProbeProxies
from benchmarks.soak_parts.supervisor import Supervisor
from gpufleet.cli.stack import SERVICES, Stack
from gpufleet.provisioner.drivers.local_faults import FAULTS_FILE, FAULTS_LOG

FAULT_CLASSES = (
    "kill_agent",
    "kill_worker",
    "kill_runner",
    "kill_service",
    "pause_agent",
    "cut_probe_path",
    "provider_faults",
    "restart_postgres",
    "gpu_fault",
)
# Faults that touch one machine: a machine none of them touched must never be replaced.
MACHINE_FAULTS = frozenset(
    {"kill_agent", "kill_worker", "kill_runner", "pause_agent", "cut_probe_path", "gpu_fault"}
)


@dataclass
class Fault:
    cls: str
    at: float  # real unix time it began
    virtual_at: float  # the control plane's clock then (unix seconds)
    machine_id: str = ""
    duration_s: float = 0.0  # real seconds it lasted (pauses, cuts, windows, outages)
    detail: str = ""
    # What a net must do about it, in the control plane's seconds from virtual_at
    # ("" = nothing may be destroyed for it; judged by the end checks).
    expect: str = ""
    deadline_virtual_s: float = 0.0


@dataclass
class Thresholds:
    """The nets' real settings (control-plane seconds unless said), from the services' own
    Settings."""

    lost_after_s: float
    lost_every_s: float
    probe_every_s: float  # the idle scanner's probes, which start a probe failure
    went_silent_after_s: float
    went_silent_every_s: float
    went_silent_grace_s: float
    heartbeat_s: float  # the worker's heartbeat, which carries the GPU health
    gpu_poll_real_s: float  # the agent reads ECC counts this often (real seconds)


FAKE_NVML_STATE = "nvml.json"  # in each machine's folder: the agent's working directory


def gpu_faults_available() -> str:
    """Why the GPU-fault class cannot run here ("" when it can)."""
    import importlib.util

    support = Path(__file__).resolve().parents[2] / "tests" / "support"
    if not (support / "fake_nvml" / "pynvml.py").exists():
        return "no file-driven fake NVML in tests/support yet (the GPU-health work)"
    if importlib.util.find_spec("gpufleet.scheduler.gpu_faults") is None:
        return "the scheduler does not act on a GPU fault yet (no gpufleet.scheduler.gpu_faults)"
    return ""


def write_gpu_state(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


@dataclass
class Chaos:
    rng: random.Random
    stack: Stack
    supervisor: Supervisor
    proxies: ProbeProxies
    postgres: Any
    machines_root: Path
    speed: float
    virtual_now: Callable[[], float]
    thresholds: Thresholds
    gap_s: tuple[float, float] = (3.0, 9.0)
    enabled: tuple[str, ...] = FAULT_CLASSES
    faults: list[Fault] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    no_target: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _timers: list[threading.Thread] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _paused: set[int] = field(default_factory=set)
    _postgres_down: threading.Event = field(default_factory=threading.Event)
    # One machine fault at a time on a machine: free again 10 s after its fault is over,
    # and never again in the life a fault doomed (a dead worker, a critical GPU). A life is
    # (machine, process group of its boot): a machine the nets stopped and the scale step
    # started again is a new life, a fair target (retiring the id had left a soak with no
    # machine to aim at once both of its pool's machines had come back from a stop).
    _free_at: dict[str, float] = field(default_factory=dict)
    _retired: set[tuple[str, int]] = field(default_factory=set)
    _lives: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (hasattr(self.postgres, "shut_down") and hasattr(self.postgres, "start_again")):
            self.unavailable["restart_postgres"] = (
                "tests/support/postgres.py has no shut_down()/start_again() yet (the PostgreSQL-restart work)"
            )
        why = gpu_faults_available()
        if why:
            self.unavailable["gpu_fault"] = why

    # ---- the loop ----------------------------------------------------------------------

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._loop, name="chaos", daemon=True)
        thread.start()
        self._thread = thread
        return thread

    def stop(self) -> None:
        """No new fault; every fault in progress ends now (agents continued, paths healed,
        the provider's window closed, PostgreSQL started)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)  # a fault being injected now: its timers are listed after
        for thread in list(self._timers):
            thread.join(30)
        for pid in list(self._paused):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.proxies.heal_all()
        self._write_provider_faults(until=0.0)

    def _loop(self) -> None:
        actions: dict[str, Callable[[], Fault | None]] = {
            "kill_agent": self.kill_agent,
            "kill_worker": self.kill_worker,
            "kill_runner": self.kill_runner,
            "kill_service": self.kill_service,
            "pause_agent": self.pause_agent,
            "cut_probe_path": self.cut_probe_path,
            "provider_faults": self.provider_faults,
            "restart_postgres": self.restart_postgres,
            "gpu_fault": self.gpu_fault,
        }
        # Rounds of every class in a shuffled order. A class with nothing to hit now (no
        # free machine, no live attempt) is tried again after the others of its round; a
        # round whose every class left found nothing ends, so a class that cannot be aimed
        # for a while never stops the others (it had: one machine class without a target
        # held the whole chaos for ten minutes of a soak).
        pending: list[str] = []
        missed: set[str] = set()
        while not self._stop.is_set():
            if not pending or set(pending) <= missed:
                pending = [c for c in self.enabled if c not in self.unavailable]
                self.rng.shuffle(pending)
                missed = set()
            if self._stop.wait(self.rng.uniform(*self.gap_s)):
                return
            cls = pending.pop(0)
            fault = actions[cls]()
            if fault is None:
                self.no_target[cls] = self.no_target.get(cls, 0) + 1
                missed.add(cls)
                pending.append(cls)
            else:
                missed.discard(cls)
                self.faults.append(fault)

    def _fault(self, cls: str, **kw: Any) -> Fault:
        return Fault(cls=cls, at=time.time(), virtual_at=self.virtual_now(), **kw)

    def _later(self, delay_s: float, action: Callable[[], None]) -> None:
        def run() -> None:
            self._stop.wait(delay_s)
            action()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._timers.append(thread)

    # ---- targets: the provider's truth, never the control plane's ---------------------

    def _machines(self) -> list[tuple[str, dict[str, Any]]]:
        found = []
        for record in self.machines_root.glob("*/instance.json"):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(record.read_text())
                machine_id = record.parent.name
                life = int(data.get("pgid") or 0)
                self._lives[machine_id] = life
                free = (machine_id, life) not in self._retired and time.time() >= self._free_at.get(
                    machine_id, 0.0
                )
                if data.get("status") == "RUNNING" and data.get("pgid") and free:
                    found.append((machine_id, data))
        return sorted(found)

    def _hold(self, fault: Fault, retire: bool = False) -> Fault:
        """Keep further machine faults off ``fault``'s machine (see ``_free_at``)."""
        if retire:
            self._retired.add((fault.machine_id, self._lives.get(fault.machine_id, 0)))
        else:
            busy = fault.duration_s + 10.0
            self._free_at[fault.machine_id] = time.time() + busy
        return fault

    def _pid(self, machine_id: str, name: str) -> int | None:
        try:
            pid = int((self.machines_root / machine_id / "disk" / name).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if Path(f"/proc/{pid}").exists() else None

    def _pick_machine_with(self, pid_file: str) -> tuple[str, dict[str, Any], int] | None:
        choices = [
            (m, r, p) for m, r in self._machines() if (p := self._pid(m, pid_file)) and p not in self._paused
        ]
        return self.rng.choice(choices) if choices else None

    # ---- the faults ----------------------------------------------------------------------

    def kill_agent(self) -> Fault | None:
        picked = self._pick_machine_with("agent.pid")
        if picked is None:
            return None
        machine_id, _, pid = picked
        os.kill(pid, signal.SIGKILL)
        fault = self._fault("kill_agent", machine_id=machine_id, detail=f"pid {pid}")

        def came_back() -> None:
            again = self._pid(machine_id, "agent.pid")
            fault.detail += f"; agent back as pid {again}" if again and again != pid else "; agent not back"

        self._later(15.0, came_back)
        return self._hold(fault)

    def kill_worker(self) -> Fault | None:
        picked = self._pick_machine_with("worker.pid")
        if picked is None:
            return None
        machine_id, _, pid = picked
        os.kill(pid, signal.SIGKILL)
        t = self.thresholds
        return self._hold(
            self._fault(
                "kill_worker",
                machine_id=machine_id,
                detail=f"pid {pid}",
                expect="went_silent",
                deadline_virtual_s=t.went_silent_after_s + t.went_silent_every_s,
            ),
            retire=True,
        )

    def kill_runner(self) -> Fault | None:
        runners = []
        for machine_id, _ in self._machines():
            for state in (self.machines_root / machine_id / "disk" / "attempts").glob("*/runner.json"):
                with contextlib.suppress(OSError, ValueError):
                    pid = int(json.loads(state.read_text())["pid"])
                    if Path(f"/proc/{pid}").exists():
                        runners.append((machine_id, state.parent.name, pid))
        if not runners:
            return None
        machine_id, attempt_id, pid = self.rng.choice(sorted(runners))
        os.kill(pid, signal.SIGKILL)
        return self._hold(
            self._fault("kill_runner", machine_id=machine_id, detail=f"attempt {attempt_id} runner pid {pid}")
        )

    def kill_service(self) -> Fault | None:
        name = self.rng.choice(SERVICES)
        proc = self.stack.processes.get(name)
        if proc is None or proc.poll() is not None:
            return None
        self.supervisor.expect_exit(name)
        os.killpg(proc.pid, signal.SIGKILL)
        return self._fault("kill_service", detail=name)

    def _outage_s(self) -> tuple[float, str, float]:
        """A pause or cut: below the lost detector's threshold, or past it plus a cadence."""
        t = self.thresholds
        if self.rng.random() < 0.5:
            virtual = self.rng.uniform(0.1, 0.6) * t.lost_after_s
            return virtual / self.speed, "", 0.0
        # A probe failure starts at the first failed probe: its cadence is part of the chain.
        deadline = t.probe_every_s + t.lost_after_s + t.lost_every_s
        virtual = self.rng.uniform(1.15, 1.5) * deadline
        return virtual / self.speed, "machine_lost", deadline

    def pause_agent(self) -> Fault | None:
        picked = self._pick_machine_with("agent.pid")
        if picked is None:
            return None
        machine_id, _, pid = picked
        seconds, expect, deadline = self._outage_s()
        os.kill(pid, signal.SIGSTOP)
        self._paused.add(pid)

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            self._paused.discard(pid)

        self._later(seconds, resume)
        fault = self._fault(
            "pause_agent",
            machine_id=machine_id,
            duration_s=seconds,
            detail=f"pid {pid}",
            expect=expect,
            deadline_virtual_s=deadline,
        )
        return self._hold(fault)

    def cut_probe_path(self) -> Fault | None:
        machines = [
            m for m, _ in self._machines() if (self.machines_root / m / "disk" / "agent.proxy_port").exists()
        ]
        if not machines:
            return None
        machine_id = self.rng.choice(machines)
        seconds, expect, deadline = self._outage_s()
        if not self.proxies.cut(machine_id):
            return None
        self._later(seconds, lambda: self.proxies.heal(machine_id))
        fault = self._fault(
            "cut_probe_path",
            machine_id=machine_id,
            duration_s=seconds,
            expect=expect,
            deadline_virtual_s=deadline,
        )
        return self._hold(fault)

    def provider_faults(self) -> Fault | None:
        seconds = self.rng.uniform(6.0, 20.0)
        fail, lose, slow = self.rng.uniform(0.2, 0.6), self.rng.uniform(0.1, 0.4), self.rng.uniform(0.3, 3.0)
        began, before = time.time(), sum(self.provider_injected().values())
        self._write_provider_faults(until=began + seconds, fail=fail, lose=lose, slow_s=slow)

        def extend() -> None:
            """A window no call fell into injected nothing: keep it open until one does
            (at most a minute), so every window is a fault, not a quiet spell."""
            while not self._stop.is_set() and time.time() < began + 60:
                if sum(self.provider_injected().values()) > before:
                    return
                self._write_provider_faults(until=time.time() + 5, fail=fail, lose=lose, slow_s=slow)
                self._stop.wait(2.0)
            fault.duration_s = time.time() - began

        fault = self._fault(
            "provider_faults",
            duration_s=seconds,
            detail=f"fail {fail:.2f}, lose {lose:.2f}, slow {slow:.1f} s",
        )
        self._later(seconds, extend)
        return fault

    def _write_provider_faults(self, until: float, **faults: float) -> None:
        """The local driver's FAULT INJECTION file; its probe proxies stay on throughout."""
        path = self.machines_root / FAULTS_FILE
        tmp = path.with_name(f".{FAULTS_FILE}.tmp")
        tmp.write_text(json.dumps({"probe_proxy": True, "until": until, **faults}))
        os.replace(tmp, path)

    def provider_injected(self) -> dict[str, int]:
        """What the driver really injected, by fault (its log)."""
        counts: dict[str, int] = {}
        path = self.machines_root / FAULTS_LOG
        for line in path.read_text().splitlines() if path.exists() else []:
            with contextlib.suppress(ValueError, KeyError):
                fault = json.loads(line)["fault"]
                counts[f"provider_{fault}"] = counts.get(f"provider_{fault}", 0) + 1
        return counts

    def restart_postgres(self) -> Fault | None:
        if self._postgres_down.is_set():
            return None
        seconds = self.rng.uniform(1.0, 12.0)
        began = time.time()
        self._postgres_down.set()
        self.postgres.shut_down("immediate")

        def start_again() -> None:
            self.postgres.start_again()
            self._postgres_down.clear()

        self._later(seconds, start_again)
        fault = self._fault("restart_postgres", duration_s=seconds, detail=f"down {seconds:.1f} s")
        fault.at = began
        return fault

    def gpu_fault(self) -> Fault | None:
        """A critical GPU fault on a machine whose agent watches its GPU (the fake NVML's
        file was there before the agent started): Xid 79, the GPU fell off the bus (an
        event, acted on at the next heartbeat), or a volatile uncorrectable ECC error
        (read every ``gpu_poll_real_s``)."""
        targets = []
        for machine_id, _ in self._machines():
            folder = self.machines_root / machine_id
            if self._pid(machine_id, "agent.pid") is None:
                continue  # its agent is down: nothing watches the GPU now
            with contextlib.suppress(OSError, ValueError):
                health = json.loads((folder / "disk" / "gpu_health.json").read_text())
                if health.get("state") not in (None, "unmonitored") and (folder / FAKE_NVML_STATE).exists():
                    targets.append(machine_id)
        if not targets:
            return None
        machine_id = self.rng.choice(targets)
        path = self.machines_root / machine_id / FAKE_NVML_STATE
        doc = json.loads(path.read_text())
        t = self.thresholds
        if self.rng.random() < 0.5:
            doc.setdefault("xid_events", []).append({"device": 0, "xid": 79})
            detail, deadline = "Xid 79 (fell off the bus)", t.heartbeat_s
        else:
            doc["devices"][0]["ecc_uncorrected_volatile"] = (
                int(doc["devices"][0].get("ecc_uncorrected_volatile", 0)) + 1
            )
            detail, deadline = "uncorrectable ECC error", t.gpu_poll_real_s * self.speed + t.heartbeat_s
        write_gpu_state(path, doc)
        fault = self._fault(
            "gpu_fault", machine_id=machine_id, detail=detail, expect="gpu_fault", deadline_virtual_s=deadline
        )
        return self._hold(fault, retire=True)

    def enable_probe_proxies(self) -> None:
        self._write_provider_faults(until=0.0)
