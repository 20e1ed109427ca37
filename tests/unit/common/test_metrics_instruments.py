"""Instruments come only from the catalogue; a label key the catalogue does not list is
refused (raised when strict, dropped and logged once otherwise); histograms get the
catalogue's buckets; a gauge asks every source; and instruments taken before a service
configures OpenTelemetry export what is recorded after."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from gpufleet.common.metrics.catalog import (
    FLEET_MACHINES,
    JOBS_SUBMITTED,
    PROVIDER_CALL_DURATION,
    REAPER_REFUSALS,
)
from gpufleet.common.metrics.instruments import Instruments, UnknownLabel
from tests.support.metrics import MetricsProbe

SUBMITTED = JOBS_SUBMITTED.name


@pytest.fixture
def probe() -> Iterator[MetricsProbe]:
    probe = MetricsProbe()
    yield probe
    probe.close()


def test_a_strict_instrument_refuses_a_label_its_metric_does_not_list(probe: MetricsProbe) -> None:
    submitted = probe.instruments.counter(JOBS_SUBMITTED)
    with pytest.raises(UnknownLabel, match=r"gpufleet\.jobs\.submitted has no label workspace"):
        submitted.add(1, {"pool": "l4", "kind": "short", "workspace": "acme"})
    submitted.add(1, {"pool": "l4", "kind": "short"})
    assert probe.series(SUBMITTED) == {(("kind", "short"), ("pool", "l4")): 1}


def test_a_lenient_instrument_drops_the_label_keeps_the_count_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    submitted = Instruments(provider).counter(JOBS_SUBMITTED)
    with caplog.at_level(logging.WARNING, logger="gpufleet.common.metrics.instruments"):
        for workspace in ("a", "b", "c"):
            submitted.add(1, {"pool": "l4", "kind": "short", "workspace": workspace})
    [metric] = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics  # type: ignore[union-attr]
    [point] = metric.data.data_points
    assert (dict(point.attributes or {}), point.value) == ({"pool": "l4", "kind": "short"}, 3)
    assert [r.getMessage() for r in caplog.records] == [
        "metric gpufleet.jobs.submitted: label 'workspace' is not in the catalogue; dropped"
    ]
    provider.shutdown()


def test_only_the_catalogues_own_declaration_makes_an_instrument(probe: MetricsProbe) -> None:
    stray = dataclasses.replace(REAPER_REFUSALS, name="gpufleet.reaper.stray")
    with pytest.raises(ValueError, match="not in the metrics catalogue"):
        probe.instruments.counter(stray)
    relabelled = dataclasses.replace(REAPER_REFUSALS, description="something else")
    with pytest.raises(ValueError, match="differs from the catalogue"):
        probe.instruments.counter(relabelled)
    with pytest.raises(ValueError, match="is a counter, not a histogram"):
        probe.instruments.histogram(REAPER_REFUSALS)


def test_a_histogram_has_the_catalogues_buckets(probe: MetricsProbe) -> None:
    duration = probe.instruments.histogram(PROVIDER_CALL_DURATION)
    duration.record(42.0, {"provider": "SIM", "operation": "create", "result": "OK"})
    [point] = probe.points(PROVIDER_CALL_DURATION.name).values()
    assert tuple(point.explicit_bounds) == PROVIDER_CALL_DURATION.buckets
    assert (point.count, point.sum) == (1, 42.0)


def test_a_gauge_asks_every_open_source_and_checks_their_labels(probe: MetricsProbe) -> None:
    l4 = {"state": "READY", "pool": "l4", "provider": "SIM"}
    a100 = {"state": "READY", "pool": "a100", "provider": "GCP"}
    first = probe.instruments.observe(FLEET_MACHINES, lambda: [(2.0, l4)])
    probe.instruments.observe(FLEET_MACHINES, lambda: [(5.0, a100)])
    assert sorted(probe.series(FLEET_MACHINES.name).values()) == [2.0, 5.0]
    first.close()
    assert list(probe.series(FLEET_MACHINES.name).values()) == [5.0]


def test_a_lenient_gauge_keeps_the_sources_that_work() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instruments = Instruments(provider)

    def broken() -> list[tuple[float, dict[str, str]]]:
        raise RuntimeError("a source with a bug")

    instruments.observe(FLEET_MACHINES, broken)
    instruments.observe(FLEET_MACHINES, lambda: [(3.0, {"state": "READY", "pool": "l4", "provider": "SIM"})])
    [metric] = reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics  # type: ignore[union-attr]
    assert [p.value for p in metric.data.data_points] == [3.0]
    provider.shutdown()


# Run in a process of its own: OpenTelemetry's global MeterProvider can be set once.
_CONFIGURED_LATER = textwrap.dedent(
    """
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from gpufleet.common.metrics.catalog import FLEET_MACHINES, JOBS_SUBMITTED, REAPER_REFUSALS
    from gpufleet.common.metrics.instruments import PROCESS

    labels = {"pool": "l4", "kind": "short"}
    early = PROCESS.counter(JOBS_SUBMITTED)   # a module's handle, made at import
    early.add(1, labels)                      # before configure: no provider, dropped
    unused = PROCESS.counter(REAPER_REFUSALS) # a handle first used after configure
    PROCESS.observe(FLEET_MACHINES, lambda: [(7.0, {"state": "READY", "pool": "l4", "provider": "SIM"})])

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))  # telemetry.configure
    early.add(2, labels)
    unused.add(1, {"net": "idle", "gate": "WORK_PINNED"})

    values = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "gpufleet"
            for m in sm.metrics:
                values[m.name] = sum(p.value for p in m.data.data_points)
    print(sorted(values.items()))
    """
)


def test_instruments_taken_before_the_provider_is_set_export_what_is_recorded_after() -> None:
    result = subprocess.run(
        [sys.executable, "-c", _CONFIGURED_LATER], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(
        [("gpufleet.fleet.machines", 7.0), ("gpufleet.jobs.submitted", 2), ("gpufleet.reaper.refusals", 1)]
    )
