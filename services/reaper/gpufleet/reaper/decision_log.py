"""Where every reaper decision is made visible: a log line, a count, a span event.

Each refusal is logged with its reason, counted in the tick's
:class:`~gpufleet.common.loops.TickReport` (which the Ticker records in
``watchdog_stats`` for ``ListWatchdogs``), counted in a metric by gate, and added as an
event on the tick's span naming the gate — so an operator can answer "why was this
machine not stopped?" from a trace as well as from the logs.
"""

from __future__ import annotations

import logging

from opentelemetry import trace

from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.catalog import REAPER_ACTIONS, REAPER_REFUSALS
from gpufleet.common.metrics.instruments import PROCESS, Instruments
from gpufleet.reaper.refusal import RefusalReason

log = logging.getLogger("gpufleet.reaper")


class DecisionLog:
    """Records one net's decisions during one tick (counted in the process's
    instruments unless a test passes its own)."""

    def __init__(
        self, net: str, report: TickReport | None = None, instruments: Instruments = PROCESS
    ) -> None:
        self.net = net
        self.report = report if report is not None else TickReport()
        self._refusals = instruments.counter(REAPER_REFUSALS)
        self._actions = instruments.counter(REAPER_ACTIONS)

    def refused(self, machine_id: str, reason: RefusalReason, detail: str = "") -> None:
        self.report.refusals[reason.value] += 1
        self._refusals.add(1, {"net": self.net, "gate": reason.value})
        trace.get_current_span().add_event(
            "refused",
            {"gpufleet.net": self.net, "gpufleet.machine_id": machine_id, "gpufleet.gate": reason.value},
        )
        log.info(
            "%s refused %s: %s%s",
            self.net,
            machine_id,
            reason.value,
            f" ({detail})" if detail else "",
            extra={"fields": {"net": self.net, "machine_id": machine_id, "gate": reason.value}},
        )

    def acted(self, machine_id: str, action: str, detail: str = "", *, level: int = logging.INFO) -> None:
        self.report.actions[action] += 1
        self._actions.add(1, {"net": self.net, "action": action})
        trace.get_current_span().add_event(
            action,
            {"gpufleet.net": self.net, "gpufleet.machine_id": machine_id},
        )
        log.log(
            level,
            "%s %s %s%s",
            self.net,
            action,
            machine_id,
            f" ({detail})" if detail else "",
            extra={"fields": {"net": self.net, "machine_id": machine_id, "action": action}},
        )
