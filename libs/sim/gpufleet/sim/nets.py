"""The simulator's side of the net registry: the settings its nets read, and their cadences.

A net's cadence, thresholds and back-offs have one home, its service's ``Settings``; the
simulator reads them from there, through the same bindings the services register their
Tickers with (``gpufleet.reaper.nets``, ``gpufleet.sweeper.nets``). Which nets it must
model is the registry's (:mod:`gpufleet.common.nets`); ``world.py`` checks its handlers
against it at import.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.common import nets
from gpufleet.reaper import nets as reaper_nets
from gpufleet.reaper.settings import Settings as ReaperSettings
from gpufleet.scheduler.settings import Settings as SchedulerSettings
from gpufleet.sweeper import nets as sweeper_nets
from gpufleet.sweeper.settings import Settings as SweeperSettings


def _reaper_defaults() -> ReaperSettings:
    # The defaults, not the shell's environment: a month reproduces wherever it is run.
    return ReaperSettings.model_construct()


def _sweeper_defaults() -> SweeperSettings:
    return SweeperSettings.model_construct()


def _scheduler_defaults() -> SchedulerSettings:
    return SchedulerSettings.model_construct()


@dataclass(frozen=True)
class NetSettings:
    """The services' settings a simulated month runs under (their defaults unless given):
    the nets' (reaper, sweeper), and the scheduler's for what the fleet tick and dispatch
    write that the nets then read (a machine's provision deadline, the dispatch deadline,
    the start back-off, when a worker counts as fresh)."""

    reaper: ReaperSettings = field(default_factory=_reaper_defaults)
    sweeper: SweeperSettings = field(default_factory=_sweeper_defaults)
    scheduler: SchedulerSettings = field(default_factory=_scheduler_defaults)

    def every(self, name: str) -> float:
        """The cadence of the registered net ``name``, in seconds, from its service's settings."""
        net = nets.BY_NAME[name]
        if net.service is nets.Service.REAPER:
            return reaper_nets.BY_NAME[name].every(self.reaper)
        return sweeper_nets.BY_NAME[name].every(self.sweeper)

    def cadences(self) -> dict[str, float]:
        """Every simulated net's cadence, in the registry's order."""
        return {net.name: self.every(net.name) for net in nets.simulated()}
