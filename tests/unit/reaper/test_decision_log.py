"""Every reaper decision is counted by net and gate (refusals) or net and action (actions),
with the catalogue's labels and no machine id among them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpufleet.common.loops import TickReport
from gpufleet.common.metrics.catalog import REAPER_ACTIONS, REAPER_REFUSALS
from gpufleet.reaper.decision_log import DecisionLog
from gpufleet.reaper.refusal import RefusalReason
from tests.support.metrics import MetricsProbe


@pytest.fixture
def probe() -> Iterator[MetricsProbe]:
    probe = MetricsProbe()
    yield probe
    probe.close()


def test_refusals_and_actions_are_counted_by_net_with_the_catalogues_labels(probe: MetricsProbe) -> None:
    report = TickReport()
    decisions = DecisionLog("idle_scanner", report, probe.instruments)
    for machine in ("m-1", "m-2"):
        decisions.refused(machine, RefusalReason.WORK_PINNED, "an attempt runs")
    decisions.refused("m-3", RefusalReason.WARM_CAPACITY)
    decisions.acted("m-4", "clear")
    # A later tick's log adds to the same series.
    DecisionLog("idle_scanner", instruments=probe.instruments).acted("m-5", "clear")

    assert probe.series(REAPER_REFUSALS.name) == {
        (("gate", "WORK_PINNED"), ("net", "idle_scanner")): 2,
        (("gate", "WARM_CAPACITY"), ("net", "idle_scanner")): 1,
    }
    assert probe.series(REAPER_ACTIONS.name) == {(("action", "clear"), ("net", "idle_scanner")): 2}
    assert report.refusals == {"WORK_PINNED": 2, "WARM_CAPACITY": 1}
