"""The reaper's nets as its Ticker runs them: each registered name bound to its cadence
setting and to how it is built.

The names and their order are the registry's (:mod:`gpufleet.common.nets`), checked when
this module is imported; ``main.build_watchdogs`` iterates :data:`REAPER_NETS`, and the
simulator reads each net's cadence through :attr:`ReaperNet.every` — so a cadence has one
home, the reaper's ``Settings``, whoever runs the net.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker

from gpufleet.common import nets
from gpufleet.common.calls import CallPool
from gpufleet.common.clock import Clock
from gpufleet.common.leadership import LeaderLease
from gpufleet.common.loops import TickReport
from gpufleet.reaper.agent_probe import AgentProber
from gpufleet.reaper.auto_destroy import AutoDestroy
from gpufleet.reaper.auto_stop import AutoStop
from gpufleet.reaper.boot_failure import BootFailure
from gpufleet.reaper.gpu_fault import GpuFault
from gpufleet.reaper.idle_scanner import AgentSampler, IdleScanner
from gpufleet.reaper.lost_detector import LostDetector
from gpufleet.reaper.provision_deadline import ProvisionDeadline
from gpufleet.reaper.settings import Settings
from gpufleet.reaper.stuck_transition import StuckProvider, StuckTransition
from gpufleet.reaper.went_silent import WentSilent


class Pass(Protocol):
    """A built net: one pass at ``now``, reporting what it did and refused."""

    name: str

    def run(self, now: datetime) -> TickReport: ...


@dataclass(frozen=True)
class Wiring:
    """What the reaper's nets are built from (``main.build``'s, or a test's)."""

    settings: Settings
    sessions: sessionmaker[Session]
    lease: LeaderLease
    clock: Clock
    provider: StuckProvider
    sampler: AgentSampler
    prober: AgentProber
    calls: CallPool


@dataclass(frozen=True)
class ReaperNet:
    net: nets.Net
    # Its cadence, in seconds of the injected clock: one field of the reaper's Settings.
    every: Callable[[Settings], float]
    build: Callable[[Wiring], Pass]

    @property
    def name(self) -> str:
        return self.net.name


def _idle(w: Wiring) -> Pass:
    s = w.settings
    return IdleScanner(
        w.sessions,
        w.lease,
        w.sampler,
        s.idle_policy(),
        concurrency=s.idle_sample_concurrency,
        pass_deadline_s=s.idle_pass_deadline_s,
    )


def _auto_stop(w: Wiring) -> Pass:
    return AutoStop(w.sessions, w.lease, w.clock, w.provider, w.settings.auto_stop_policy(), calls=w.calls)


def _auto_destroy(w: Wiring) -> Pass:
    policy = w.settings.auto_destroy_policy()
    return AutoDestroy(w.sessions, w.lease, w.clock, w.provider, policy, calls=w.calls)


def _provision_deadline(w: Wiring) -> Pass:
    s = w.settings
    return ProvisionDeadline(
        w.sessions,
        w.lease,
        w.clock,
        w.provider,
        s.provision_deadline_policy(),
        s.outcome_policy(),
        calls=w.calls,
    )


def _boot_failure(w: Wiring) -> Pass:
    s = w.settings
    return BootFailure(
        w.sessions,
        w.lease,
        w.clock,
        w.provider,
        w.prober,
        s.boot_failure_policy(),
        s.outcome_policy(),
        concurrency=s.idle_sample_concurrency,
        calls=w.calls,
    )


def _went_silent(w: Wiring) -> Pass:
    s = w.settings
    return WentSilent(
        w.sessions, w.lease, w.clock, w.provider, s.went_silent_policy(), s.outcome_policy(), calls=w.calls
    )


def _lost_detector(w: Wiring) -> Pass:
    # Given no provisioner at all: it marks, it never stops or destroys.
    return LostDetector(w.sessions, w.lease, w.clock, w.settings.lost_policy())


def _stuck_transition(w: Wiring) -> Pass:
    s = w.settings
    return StuckTransition(
        w.sessions, w.lease, w.clock, w.provider, s.stuck_policy(), s.outcome_policy(), calls=w.calls
    )


def _gpu_fault(w: Wiring) -> Pass:
    s = w.settings
    return GpuFault(
        w.sessions, w.lease, w.clock, w.provider, s.gpu_fault_policy(), s.outcome_policy(), calls=w.calls
    )


_NET = nets.BY_NAME

REAPER_NETS: tuple[ReaperNet, ...] = (
    ReaperNet(_NET["idle_scanner"], lambda s: s.idle_scan_every_s, _idle),
    ReaperNet(_NET["auto_stop"], lambda s: s.auto_stop_every_s, _auto_stop),
    ReaperNet(_NET["auto_destroy"], lambda s: s.auto_destroy_every_s, _auto_destroy),
    ReaperNet(_NET["provision_deadline"], lambda s: s.provision_deadline_every_s, _provision_deadline),
    ReaperNet(_NET["boot_failure"], lambda s: s.boot_failure_every_s, _boot_failure),
    ReaperNet(_NET["went_silent"], lambda s: s.went_silent_every_s, _went_silent),
    ReaperNet(_NET["lost_detector"], lambda s: s.lost_detector_every_s, _lost_detector),
    ReaperNet(_NET["stuck_transition"], lambda s: s.stuck_transition_every_s, _stuck_transition),
    ReaperNet(_NET["gpu_fault"], lambda s: s.gpu_fault_every_s, _gpu_fault),
)
nets.check_covers("the reaper", tuple(n.name for n in REAPER_NETS), nets.of(nets.Service.REAPER))

BY_NAME: dict[str, ReaperNet] = {n.name: n for n in REAPER_NETS}
