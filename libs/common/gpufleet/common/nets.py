"""The one list of safety nets: every watchdog the reaper and the sweeper run, by name.

Each service keeps the nets' code, cadences and wiring (``gpufleet.reaper.nets``,
``gpufleet.sweeper.nets``), and the simulator keeps its model of each; this list is what
all three answer to, importable without importing a service. A net added here and not run
by its service, run by a service and not listed here, or listed and not modelled by the
simulator fails the drift tests (tests/unit/test_net_registry.py) — so adding a watchdog
means saying, here, whether the simulator models it, and if not, why.

The order is the order each service registers its nets on its Ticker, and the order the
simulator schedules them at equal times: a month reproduces only if it never changes
silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Service(StrEnum):
    """The service whose leader runs a net."""

    REAPER = "reaper"
    SWEEPER = "sweeper"


@dataclass(frozen=True)
class Net:
    """One net: its name (the Ticker's task, the ``watchdog_stats`` row, the ledger's
    detector), the service that runs it, and — only when the simulator does not model it —
    why not."""

    name: str
    service: Service
    not_simulated: str = ""

    @property
    def simulated(self) -> bool:
        return not self.not_simulated


NETS: tuple[Net, ...] = (
    Net("idle_scanner", Service.REAPER),
    Net("auto_stop", Service.REAPER),
    Net("auto_destroy", Service.REAPER),
    Net("provision_deadline", Service.REAPER),
    Net("boot_failure", Service.REAPER),
    Net("went_silent", Service.REAPER),
    Net("lost_detector", Service.REAPER),
    Net("stuck_transition", Service.REAPER),
    Net(
        "gpu_fault",
        Service.REAPER,
        not_simulated="the simulator's machines have no GPU health findings (no Xid, no ECC "
        "errors), so there is nothing for this net to read; its decision is tested by table "
        "and on the plane (tests/integration/reaper/test_gpu_fault.py)",
    ),
    Net("inventory_reconcile", Service.SWEEPER),
    Net("orphan_sweep", Service.SWEEPER),
)

BY_NAME: dict[str, Net] = {n.name: n for n in NETS}
assert len(BY_NAME) == len(NETS), "a net is listed twice"


def of(service: Service) -> tuple[Net, ...]:
    """The nets ``service`` runs, in registration order."""
    return tuple(n for n in NETS if n.service is service)


def simulated() -> tuple[Net, ...]:
    """The nets the simulator must model, in scheduling order."""
    return tuple(n for n in NETS if n.simulated)


def check_covers(who: str, names: list[str] | tuple[str, ...], expected: tuple[Net, ...]) -> None:
    """Raise unless ``names`` are exactly ``expected``'s, in the same order: how each side
    proves at import (and the drift tests at test time) that it runs every net it must,
    and nothing else."""
    want = [n.name for n in expected]
    if list(names) != want:
        missing = sorted(set(want) - set(names))
        extra = sorted(set(names) - set(want))
        raise RuntimeError(
            f"{who} does not match the net registry (gpufleet.common.nets): missing {missing}, "
            f"not registered {extra}, order {list(names)} vs {want}"
        )
