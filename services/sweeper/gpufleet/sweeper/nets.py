"""The sweeper's passes as its Ticker runs them: each registered name bound to its cadence
setting and to the pass that runs it.

The names and their order are the registry's (:mod:`gpufleet.common.nets`), checked when
this module is imported; ``main.TimedPasses.tasks`` iterates :data:`SWEEPER_NETS`, and the
simulator reads each pass's cadence through :attr:`SweeperNet.every` — so a cadence has
one home, the sweeper's ``Settings``, whoever runs the pass.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from gpufleet.common import nets
from gpufleet.common.loops import TickReport
from gpufleet.sweeper.settings import Settings

Run = Callable[[datetime], TickReport]


class Passes(Protocol):
    """The leader's fenced, recorded passes (``main.TimedPasses``)."""

    def run_reconcile(self, now: datetime) -> TickReport: ...

    def run_orphan_sweep(self, now: datetime) -> TickReport: ...


@dataclass(frozen=True)
class SweeperNet:
    net: nets.Net
    # Its cadence, in seconds of the injected clock: one field of the sweeper's Settings.
    every: Callable[[Settings], float]
    run: Callable[[Passes], Run]

    @property
    def name(self) -> str:
        return self.net.name


SWEEPER_NETS: tuple[SweeperNet, ...] = (
    SweeperNet(
        nets.BY_NAME["inventory_reconcile"],
        lambda s: s.inventory_reconcile_every_s,
        lambda p: p.run_reconcile,
    ),
    SweeperNet(nets.BY_NAME["orphan_sweep"], lambda s: s.orphan_sweep_every_s, lambda p: p.run_orphan_sweep),
)
nets.check_covers("the sweeper", tuple(n.name for n in SWEEPER_NETS), nets.of(nets.Service.SWEEPER))

BY_NAME: dict[str, SweeperNet] = {n.name: n for n in SWEEPER_NETS}
