"""The metrics catalogue: every metric well formed, labels only from the bounded vocabulary,
and Prometheus names that are the ones OpenTelemetry's own Prometheus exporter writes.
The semantic-convention metrics are checked against the semantic-conventions package:
each is the package's instrument, with its unit, and none of its keys is one the package
has deprecated."""

from __future__ import annotations

import dataclasses
import inspect
import re
from types import ModuleType
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.semconv._incubating.attributes import rpc_attributes
from opentelemetry.semconv._incubating.metrics import db_metrics as incubating_db_metrics
from opentelemetry.semconv._incubating.metrics import rpc_metrics
from opentelemetry.semconv.attributes import db_attributes, error_attributes, server_attributes
from opentelemetry.semconv.metrics import db_metrics
from prometheus_client import CollectorRegistry

from gpufleet.common.metrics.catalog import (
    CATALOGUE,
    DB_CLIENT_OPERATION_DURATION,
    FORBIDDEN_LABEL_KEYS,
    LABELS,
    NET,
    POOL,
    REAPER_REFUSALS,
    RPC_METHOD,
    RPC_SERVER_CALL_DURATION,
    SEMCONV_LABELS,
    Instrument,
    Label,
    Metric,
    Origin,
    by_name,
    prometheus_name,
)
from gpufleet.common.metrics.instruments import Instruments

SEMCONV = [m for m in CATALOGUE if m.origin is Origin.SEMCONV]


def test_the_vocabulary_holds_no_unbounded_key() -> None:
    assert set(LABELS) & FORBIDDEN_LABEL_KEYS == set()
    assert set(SEMCONV_LABELS) & FORBIDDEN_LABEL_KEYS == set()
    for metric in CATALOGUE:
        assert metric.label_keys <= set(metric.vocabulary), metric.name
        assert by_name(metric.name) is metric


def test_the_conventions_metrics_are_the_ones_the_issue_asks_for() -> None:
    assert {m.prometheus_name for m in SEMCONV} == {
        "rpc_server_call_duration_seconds",
        "rpc_client_call_duration_seconds",
        "db_client_operation_duration_seconds",
    }


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
        ({"labels": (NET, RPC_METHOD)}, "not in the vocabulary"),
        ({"labels": (Label("net", "another bound"),)}, "not in the vocabulary"),
        ({"name": "rpc.server.call.duration"}, "gpufleet.<area>.<thing>"),
    ],
)
def test_a_malformed_declaration_is_refused_when_it_is_made(change: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint.replace(".", r"\.")):
        dataclasses.replace(REAPER_REFUSALS, **change)


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        # A name the conventions do not define for gpufleet, or one of gpufleet's own.
        ({"name": "rpc.server.duration"}, "not a semantic-convention metric"),
        ({"name": "gpufleet.rpc.duration"}, "not a semantic-convention metric"),
        # gpufleet's vocabulary is not the conventions'.
        ({"labels": (RPC_METHOD, POOL)}, "label 'pool' is not in the vocabulary"),
        # The conventions' addresses: every peer, every server.
        ({"labels": (Label(server_attributes.SERVER_ADDRESS, "every server"),)}, "not in the vocabulary"),
        ({"labels": (Label("net.peer.name", "every peer"),)}, "not in the vocabulary"),
        ({"labels": (Label(db_attributes.DB_QUERY_TEXT, "every statement"),)}, "not in the vocabulary"),
    ],
)
def test_a_malformed_semantic_convention_metric_is_refused(change: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=re.escape(complaint)):
        dataclasses.replace(RPC_SERVER_CALL_DURATION, **change)


class _Recorded:
    """A meter that keeps what the semantic-conventions package asks it to create."""

    def __init__(self) -> None:
        self.made: dict[str, tuple[Instrument, str]] = {}

    def create_histogram(self, name: str, unit: str = "", description: str = "", **_: Any) -> None:
        self.made[name] = (Instrument.HISTOGRAM, unit)

    def create_counter(self, name: str, unit: str = "", description: str = "", **_: Any) -> None:
        self.made[name] = (Instrument.COUNTER, unit)

    def create_up_down_counter(self, name: str, unit: str = "", description: str = "", **_: Any) -> None:
        self.made[name] = (Instrument.UP_DOWN_COUNTER, unit)


@pytest.mark.parametrize("metric", SEMCONV, ids=lambda m: m.name)
def test_a_convention_metric_is_the_packages_instrument_with_its_unit(metric: Metric) -> None:
    """The package's own ``create_<name>`` says what the instrument and unit are (the
    stable module holds only the names; the incubating one keeps the factories)."""
    meter = _Recorded()
    create = f"create_{metric.name.replace('.', '_')}"
    [module] = [m for m in (incubating_db_metrics, rpc_metrics) if hasattr(m, create)]
    getattr(module, create)(meter)
    assert meter.made == {metric.name: (metric.instrument, metric.unit)}


def _documentation(module: ModuleType, key: str) -> str | None:
    """The text the package writes under the constant whose value is ``key``."""
    found = re.search(
        rf'^[A-Z0-9_]+: Final = "{re.escape(key)}"\n"""\n(.*?)"""', inspect.getsource(module), re.M | re.S
    )
    return found.group(1) if found else None


@pytest.mark.parametrize("key", sorted(SEMCONV_LABELS))
def test_no_attribute_key_is_one_the_package_deprecates(key: str) -> None:
    """When a newer package renames a key (the specification's head already spells
    rpc.response.status_code rpc.status_code), this fails until the catalogue follows."""
    documented = [
        text
        for module in (rpc_attributes, db_attributes, error_attributes)
        if (text := _documentation(module, key)) is not None
    ]
    assert documented, f"{key} is none of the package's attribute constants"
    assert not any(text.startswith("Deprecated") for text in documented), documented


def test_the_deprecation_check_sees_a_deprecated_key() -> None:
    documented = _documentation(rpc_attributes, rpc_attributes.RPC_GRPC_STATUS_CODE)
    assert documented is not None and documented.startswith("Deprecated")


def test_the_database_duration_is_the_stable_conventions() -> None:
    """The stable module names it; the incubating one only repeats the name, deprecated."""
    assert DB_CLIENT_OPERATION_DURATION.name == db_metrics.DB_CLIENT_OPERATION_DURATION


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


def test_every_label_is_named_in_prometheus_as_the_reference_says() -> None:
    """A convention's dotted keys are written with underscores (``rpc.method`` is
    ``rpc_method``): the reference's label names are the exporter's."""
    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry, disable_target_info=True)
    provider = MeterProvider(metric_readers=[reader])
    try:
        _one_of_each(Instruments(provider, strict=True))
        written = {
            sample.name: {key for key in sample.labels if key != "le" and not key.startswith("otel_scope_")}
            for family in registry.collect()
            for sample in family.samples
        }
    finally:
        provider.shutdown()
    for metric in CATALOGUE:
        sample = f"{metric.prometheus_name}_count" if metric.instrument is Instrument.HISTOGRAM else None
        labels = written[sample or metric.prometheus_name]
        assert labels == {label.prometheus_key for label in metric.labels}, metric.name
    assert written["rpc_server_call_duration_seconds_count"] == {
        "rpc_system_name",
        "rpc_method",
        "rpc_response_status_code",
        "error_type",
    }
