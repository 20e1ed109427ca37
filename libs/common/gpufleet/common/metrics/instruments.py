"""The only place gpufleet creates OpenTelemetry instruments: from the catalogue.

A component asks an :class:`Instruments` for a handle on a catalogue :class:`Metric`
(``instruments.counter(JOBS_SUBMITTED)``) and records through it. The handle checks each
measurement's label keys against the catalogue; the underlying instrument is created on
first use and once per metric.

Why lazily: a service's ``main()`` sets OpenTelemetry's global MeterProvider
(``telemetry.configure``) after its modules were imported, and modules hold handles. The
process's :data:`PROCESS` instruments take their meter from the global provider only when
the first measurement comes; a meter taken before ``configure`` is the OpenTelemetry API's
proxy, which hands every instrument made from it to the real provider once one is set. So
what is recorded after ``configure`` is exported either way. A value recorded before it
is dropped: no provider, no reader (every ``main()`` configures before it builds anything
that records). A test passes a provider of its own (with an ``InMemoryMetricReader``) and
reads what it recorded, without touching the process's global one.

A label key the catalogue does not list for the metric is refused, two ways:

- ``strict=True`` (tests): :class:`UnknownLabel` is raised at the call that recorded it, so
  the mistake fails the test that made it.
- ``strict=False`` (:data:`PROCESS`, production): the unlisted keys are dropped, the
  measurement is kept without them, and a warning is logged once per metric and key. A
  metric is never worth a failed SubmitJob or a watchdog tick that stops half-way, and
  the bound holds either way: the unlisted key never reaches the exporter.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Meter, MeterProvider, Observation

from gpufleet.common.errors import GpufleetError
from gpufleet.common.metrics.catalog import Instrument, Metric, by_name

__all__ = [
    "PROCESS",
    "SCOPE",
    "Counter",
    "Histogram",
    "Instruments",
    "Observing",
    "UnknownLabel",
    "UpDownCounter",
]

log = logging.getLogger(__name__)

# The instrumentation scope of every gpufleet metric: one scope, so each metric is one
# family in Prometheus (the exporter adds the scope as the ``otel_scope_name`` label).
SCOPE = "gpufleet"

Labels = Mapping[str, str]
# What an observable gauge's source yields at each collection: (value, labels) pairs.
Source = Callable[[], Iterable[tuple[float, Labels]]]


class UnknownLabel(GpufleetError):
    """A measurement named a label key its metric does not list (strict instruments)."""


class Instruments:
    """Handles on the catalogue's metrics, over one MeterProvider (OpenTelemetry's global
    one when ``provider`` is None, looked up at the first measurement)."""

    def __init__(self, provider: MeterProvider | None = None, *, strict: bool = False) -> None:
        self.strict = strict
        self._provider = provider
        self._lock = threading.Lock()
        self._meter: Meter | None = None
        self._created: dict[str, Any] = {}
        self._sources: dict[str, list[Source]] = {}
        self._warned: set[tuple[str, str]] = set()

    # -- handles -------------------------------------------------------------------------
    def counter(self, metric: Metric) -> Counter:
        return Counter(self, self._declared(metric, Instrument.COUNTER))

    def up_down_counter(self, metric: Metric) -> UpDownCounter:
        return UpDownCounter(self, self._declared(metric, Instrument.UP_DOWN_COUNTER))

    def histogram(self, metric: Metric) -> Histogram:
        return Histogram(self, self._declared(metric, Instrument.HISTOGRAM))

    def observe(self, metric: Metric, source: Source) -> Observing:
        """Report what ``source`` yields as ``metric``'s values at every collection, until
        the returned :class:`Observing` is closed. Several sources may feed one gauge
        (OpenTelemetry keeps the callbacks a gauge was created with, so the gauge is
        created once, with one callback that asks every source)."""
        self._declared(metric, Instrument.OBSERVABLE_GAUGE)
        with self._lock:
            self._sources.setdefault(metric.name, []).append(source)
        self._instrument(metric)
        return Observing(self, metric, source)

    # -- inside --------------------------------------------------------------------------
    @staticmethod
    def _declared(metric: Metric, instrument: Instrument) -> Metric:
        """Only a catalogue metric, through the handle of its own instrument."""
        try:
            declared = by_name(metric.name)
        except KeyError:
            raise ValueError(f"{metric.name} is not in the metrics catalogue") from None
        if declared is not metric and declared != metric:
            raise ValueError(f"{metric.name} differs from the catalogue's declaration")
        if metric.instrument is not instrument:
            raise ValueError(f"{metric.name} is a {metric.instrument}, not a {instrument}")
        return declared

    def _instrument(self, metric: Metric) -> Any:
        with self._lock:
            created = self._created.get(metric.name)
            if created is None:
                created = self._created[metric.name] = self._create(metric)
            return created

    def _create(self, metric: Metric) -> Any:
        if self._meter is None:
            provider = self._provider if self._provider is not None else metrics.get_meter_provider()
            self._meter = provider.get_meter(SCOPE)
        meter, name, unit, about = self._meter, metric.name, metric.unit, metric.description
        match metric.instrument:
            case Instrument.COUNTER:
                return meter.create_counter(name, unit, about)
            case Instrument.UP_DOWN_COUNTER:
                return meter.create_up_down_counter(name, unit, about)
            case Instrument.HISTOGRAM:
                return meter.create_histogram(
                    name, unit, about, explicit_bucket_boundaries_advisory=metric.buckets
                )
            case Instrument.OBSERVABLE_GAUGE:
                return meter.create_observable_gauge(name, [self._callback(metric)], unit, about)

    def _callback(self, metric: Metric) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def collect(_options: CallbackOptions) -> Iterator[Observation]:
            with self._lock:
                sources = list(self._sources.get(metric.name, ()))
            for source in sources:
                try:
                    observed = [
                        Observation(value, self.checked(metric, labels)) for value, labels in source()
                    ]
                except Exception:
                    if self.strict:
                        raise
                    # One failing source must not blank the others (the SDK drops the
                    # whole gauge's collection when its callback raises).
                    log.exception("metric %s: a source failed; left out of this collection", metric.name)
                    continue
                yield from observed

        return collect

    def _forget(self, metric: Metric, source: Source) -> None:
        with self._lock:
            sources = self._sources.get(metric.name, [])
            if source in sources:
                sources.remove(source)

    def checked(self, metric: Metric, labels: Labels | None) -> Labels | None:
        """``labels`` when every key is one ``metric`` lists; otherwise refused (strict) or
        without the unlisted keys (see the module's docstring)."""
        if labels is None or labels.keys() <= metric.label_keys:
            return labels
        unknown = sorted(set(labels) - metric.label_keys)
        if self.strict:
            allowed = ", ".join(sorted(metric.label_keys)) or "none"
            raise UnknownLabel(f"{metric.name} has no label {', '.join(unknown)} (it has: {allowed})")
        for key in unknown:
            if (metric.name, key) not in self._warned:
                self._warned.add((metric.name, key))
                log.warning("metric %s: label %r is not in the catalogue; dropped", metric.name, key)
        return {k: v for k, v in labels.items() if k in metric.label_keys}


class _Handle:
    __slots__ = ("_instrument", "_instruments", "metric")

    def __init__(self, instruments: Instruments, metric: Metric) -> None:
        self._instruments = instruments
        self.metric = metric
        self._instrument: Any = None

    def _otel(self) -> Any:
        if self._instrument is None:
            self._instrument = self._instruments._instrument(self.metric)
        return self._instrument


class Counter(_Handle):
    __slots__ = ()

    def add(self, value: float = 1, labels: Labels | None = None) -> None:
        self._otel().add(value, self._instruments.checked(self.metric, labels))


class UpDownCounter(_Handle):
    __slots__ = ()

    def add(self, value: float, labels: Labels | None = None) -> None:
        self._otel().add(value, self._instruments.checked(self.metric, labels))


class Histogram(_Handle):
    __slots__ = ()

    def record(self, value: float, labels: Labels | None = None) -> None:
        self._otel().record(value, self._instruments.checked(self.metric, labels))


class Observing:
    """One source feeding an observable gauge; ``close()`` stops it being asked."""

    def __init__(self, instruments: Instruments, metric: Metric, source: Source) -> None:
        self._instruments = instruments
        self.metric = metric
        self._source = source

    def close(self) -> None:
        self._instruments._forget(self.metric, self._source)


# The process's instruments, on OpenTelemetry's global MeterProvider: what every service
# records through unless a test hands a component instruments of its own.
PROCESS = Instruments()
