"""The metrics catalogue: every metric well formed, labels only from the bounded vocabulary,
and Prometheus names that are the ones OpenTelemetry's own Prometheus exporter writes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry

from gpufleet.common.metrics.catalog import (
    CATALOGUE,
    FORBIDDEN_LABEL_KEYS,
    LABELS,
    NET,
    REAPER_REFUSALS,
    Instrument,
    Label,
    by_name,
    prometheus_name,
)
from gpufleet.common.metrics.instruments import Instruments


def test_the_vocabulary_holds_no_unbounded_key() -> None:
    assert set(LABELS) & FORBIDDEN_LABEL_KEYS == set()
    for metric in CATALOGUE:
        assert metric.label_keys <= set(LABELS), metric.name
        assert by_name(metric.name) is metric


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"name": "reaper.refusals"}, "gpufleet.<area>.<thing>"),
        ({"name": "gpufleet.Reaper.refusals"}, "gpufleet.<area>.<thing>"),
        ({"unit": ""}, "a unit is required"),
        ({"labels": (NET, NET)}, "listed twice"),
        ({"labels": (Label("job_id", "every job"),)}, "not in the vocabulary"),
        ({"labels": (Label("machine", "every machine"),)}, "not in the vocabulary"),
        ({"labels": (Label("colour", "made up"),)}, "not in the vocabulary"),
        ({"buckets": (1.0, 2.0)}, "only for one"),
        ({"instrument": Instrument.HISTOGRAM}, "buckets are given for a histogram"),
        ({"instrument": Instrument.HISTOGRAM, "buckets": (2.0, 1.0)}, "must increase"),
    ],
)
def test_a_malformed_declaration_is_refused_when_it_is_made(change: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint.replace(".", r"\.")):
        dataclasses.replace(REAPER_REFUSALS, **change)


@pytest.mark.parametrize(
    ("name", "unit", "instrument", "expected"),
    [
        ("gpufleet.reaper.refusals", "{refusal}", Instrument.COUNTER, "gpufleet_reaper_refusals_total"),
        ("gpufleet.tick.duration", "s", Instrument.HISTOGRAM, "gpufleet_tick_duration_seconds"),
        ("gpufleet.fleet.machines", "{machine}", Instrument.OBSERVABLE_GAUGE, "gpufleet_fleet_machines"),
        ("gpufleet.queue.depth", "{job}", Instrument.UP_DOWN_COUNTER, "gpufleet_queue_depth"),
        ("gpufleet.gpu.billed", "s", Instrument.COUNTER, "gpufleet_gpu_billed_seconds_total"),
        ("gpufleet.idle.seconds", "s", Instrument.COUNTER, "gpufleet_idle_seconds_total"),
        ("gpufleet.calls.total", "{call}", Instrument.COUNTER, "gpufleet_calls_total"),
        ("gpufleet.disk.read", "By/s", Instrument.OBSERVABLE_GAUGE, "gpufleet_disk_read_bytes_per_second"),
        ("gpufleet.idle.share", "1", Instrument.OBSERVABLE_GAUGE, "gpufleet_idle_share"),
    ],
)
def test_prometheus_names_follow_opentelemetrys_conversion(
    name: str, unit: str, instrument: Instrument, expected: str
) -> None:
    assert prometheus_name(name, unit, instrument) == expected


def _one_of_each(instruments: Instruments) -> None:
    labels_of = {m.name: {label.key: "x" for label in m.labels} for m in CATALOGUE}
    for metric in CATALOGUE:
        labels = labels_of[metric.name]
        match metric.instrument:
            case Instrument.COUNTER:
                instruments.counter(metric).add(1, labels)
            case Instrument.UP_DOWN_COUNTER:
                instruments.up_down_counter(metric).add(1, labels)
            case Instrument.HISTOGRAM:
                instruments.histogram(metric).record(0.1, labels)
            case Instrument.OBSERVABLE_GAUGE:
                instruments.observe(metric, lambda labels=labels: [(1.0, labels)])  # type: ignore[misc]


def test_every_catalogue_name_is_the_one_the_prometheus_exporter_writes() -> None:
    """What the reference promises a PromQL user is what a scrape of a gpufleet service
    shows: each metric recorded once through the real exporter, its samples' names read."""
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry, disable_target_info=True)
    provider = MeterProvider(metric_readers=[reader])
    try:
        _one_of_each(Instruments(provider, strict=True))
        samples = {sample.name for family in registry.collect() for sample in family.samples}
    finally:
        provider.shutdown()
    for metric in CATALOGUE:
        if metric.instrument is Instrument.HISTOGRAM:
            assert f"{metric.prometheus_name}_count" in samples, metric.name
            assert f"{metric.prometheus_name}_bucket" in samples, metric.name
        else:
            assert metric.prometheus_name in samples, (metric.name, sorted(samples))
