"""Logging and OpenTelemetry set-up, shared by every process.

Logs are JSON lines carrying the current trace id, so a log line can be found from a
trace and the reverse. Traces export over OTLP when ``GPUFLEET_OTLP_ENDPOINT`` is set;
otherwise spans are still created (tests read them) but go nowhere. The export is a
connection like any other: by default mutual TLS to a collector that proves the
deployment's ``collector`` identity (:class:`OtlpTarget`), with the process's certificate
followed as its files change (:func:`span_exporter`, :func:`metric_exporter`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import grpc
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gpufleet.common.trust.material import TlsMaterial
    from gpufleet.common.trust.reload import TlsReloader

_configured = False
# Set when the process runs without TLS (GPUFLEET_INSECURE): every log line says so.
_insecure = False


def mark_insecure() -> None:
    """Said once, on every line after (a process may build its transport more than once).
    Marked before logging is configured (a ``main()`` builds its transport first), it is
    said as the first line once it is."""
    global _insecure
    if _insecure:
        return
    _insecure = True
    if _configured:
        _say_insecure()


def _say_insecure() -> None:
    logging.getLogger(__name__).warning(
        "running INSECURE: plaintext gRPC, no caller is authenticated or authorized "
        "(GPUFLEET_INSECURE is for local development only)"
    )


@dataclass(frozen=True)
class OtlpTarget:
    """Where traces and metrics go, and how the connection is secured: ``credentials``
    None is plaintext; ``server_name``, when set, is the name the collector's certificate
    must carry (the deployment's ``collector`` identity), whatever address was dialled."""

    endpoint: str
    credentials: grpc.ChannelCredentials | None
    server_name: str | None = None
    # Why it is plaintext, said once at start-up (None when it is not, or the whole process
    # runs insecure and says so on every line).
    plaintext_warning: str | None = None
    # The process's own certificate files, when the export proves the process's identity
    # with them: followed, so the export opens its connections with the certificate in
    # force (``credentials`` is then only what they held when the target was made).
    follow: TlsReloader | None = None

    def exporter_args(self, credentials: grpc.ChannelCredentials | None = None) -> dict[str, Any]:
        """An OTLP exporter's arguments, with ``credentials`` in place of the target's own
        when given."""
        credentials = credentials or self.credentials
        if credentials is None:
            return {"endpoint": self.endpoint, "insecure": True}
        options = (("grpc.ssl_target_name_override", self.server_name),) if self.server_name else None
        return {
            "endpoint": self.endpoint,
            "insecure": False,
            "credentials": credentials,
            "channel_options": options,
        }


def span_exporter(otlp: OtlpTarget, **kwargs: Any) -> SpanExporter:
    """The OTLP span exporter of ``otlp`` (``kwargs``: more of OTLPSpanExporter's own),
    following the process's certificate files when the target does."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    if otlp.follow is None:
        return OTLPSpanExporter(**otlp.exporter_args(), **kwargs)
    return FollowingSpanExporter(_Rebuilt(otlp, lambda args: OTLPSpanExporter(**args, **kwargs)))


def metric_exporter(otlp: OtlpTarget, **kwargs: Any) -> MetricExporter:
    """The OTLP metric exporter of ``otlp``, following the files as :func:`span_exporter`."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    if otlp.follow is None:
        return OTLPMetricExporter(**otlp.exporter_args(), **kwargs)
    return FollowingMetricExporter(_Rebuilt(otlp, lambda args: OTLPMetricExporter(**args, **kwargs)))


_E = TypeVar("_E", bound=SpanExporter | MetricExporter)


class _Rebuilt(Generic[_E]):
    """An OTLP exporter made again when the process's certificate files change.

    OpenTelemetry's OTLP exporters take ``grpc.ChannelCredentials`` once, in their
    constructor, and keep them for every channel they open (their reconnection after an
    UNAVAILABLE too); gRPC's credentials are fixed values, and there is no public way to
    hand an exporter new ones. So the exporter is made again, from its public constructor,
    with the material in force: before an export, when the material changed. The exports
    of one exporter are serialised (the SDK's processors and readers hold a lock around
    them, and :class:`FollowingSpanExporter`/:class:`FollowingMetricExporter` hold their
    own), so the old exporter has no export in flight when it is shut down (its channel
    closed).
    """

    def __init__(self, target: OtlpTarget, make: Callable[[dict[str, Any]], _E]) -> None:
        assert target.follow is not None
        self._reloader = target.follow
        self._target = target
        self._make: Callable[[dict[str, Any]], _E] = make
        self.lock = threading.Lock()
        self._material = self._reloader.current()
        self.exporter: _E = make(self._args(self._material))
        # How many times the exporter was made again.
        self.rebuilt = 0
        self.closed = False

    def _args(self, material: TlsMaterial) -> dict[str, Any]:
        from gpufleet.common.trust.reloading_channel import channel_credentials

        return self._target.exporter_args(channel_credentials(material))

    def current(self) -> _E:
        """The exporter to export with now (call with :attr:`lock` held)."""
        material = self._reloader.current()
        if material is not self._material and not self.closed:
            old = self.exporter
            self.exporter = self._make(self._args(material))
            self._material = material
            self.rebuilt += 1
            old.shutdown()
            logging.getLogger(__name__).debug(
                "OTLP export to %s made again with %s", self._target.endpoint, material.describe()
            )
        return self.exporter


class FollowingSpanExporter(SpanExporter):
    """An OTLP span exporter whose certificate follows the process's files (:class:`_Rebuilt`)."""

    def __init__(self, rebuilt: _Rebuilt[SpanExporter]) -> None:
        self.rebuilt = rebuilt

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.rebuilt.lock:
            return self.rebuilt.current().export(spans)

    def shutdown(self) -> None:
        # Not under the lock: a shutdown cuts short an export waiting to retry.
        self.rebuilt.closed = True
        self.rebuilt.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.rebuilt.exporter.force_flush(timeout_millis)


class FollowingMetricExporter(MetricExporter):
    """An OTLP metric exporter whose certificate follows the process's files
    (:class:`_Rebuilt`). It states the temporality and aggregation the OTLP exporter it
    wraps prefers (from the environment): the reader asks the exporter it is given."""

    def __init__(self, rebuilt: _Rebuilt[MetricExporter]) -> None:
        first = rebuilt.exporter
        # MetricExporter's constructor keeps these, and PeriodicExportingMetricReader reads
        # them back from the exporter it is given; there is no public getter.
        super().__init__(
            preferred_temporality=first._preferred_temporality,
            preferred_aggregation=first._preferred_aggregation,
        )
        self.rebuilt = rebuilt

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        with self.rebuilt.lock:
            return self.rebuilt.current().export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.rebuilt.exporter.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        self.rebuilt.closed = True
        self.rebuilt.exporter.shutdown(timeout_millis=timeout_millis, **kwargs)


class JsonFormatter(logging.Formatter):
    """One JSON object a line, with the trace and span ids of the active span."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            payload["trace_id"] = f"{span.trace_id:032x}"
            payload["span_id"] = f"{span.span_id:016x}"
        if _insecure:
            payload["insecure"] = True
        extra = getattr(record, "fields", None)
        if isinstance(extra, dict):
            payload.update(extra)
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        return f"{line} [INSECURE]" if _insecure else line


def configure(
    service: str,
    *,
    otlp: OtlpTarget | None = None,
    level: str = "INFO",
    log_format: str = "json",
    scrape: CollectorRegistry | None = None,
) -> None:
    """Configure logging, the tracer provider and the meter provider once per process.

    A meter provider takes its readers when it is made and is set once, so every way the
    metrics leave is decided here: pushed over OTLP (``otlp``) and/or read by Prometheus
    from ``scrape``, the registry the process's metrics listener serves
    (:mod:`gpufleet.common.metrics_listener`). Both may be on at once."""
    global _configured
    if _configured:
        return
    _configured = True
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter(f"%(asctime)s {service} %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    if _insecure:
        _say_insecure()
    if otlp is not None and otlp.plaintext_warning:
        logging.getLogger(__name__).warning("%s", otlp.plaintext_warning)
    resource = Resource.create({"service.name": f"gpufleet-{service}"})
    # With nowhere to send them, spans are not recorded (they still get ids, which the
    # logs carry): recording them cost about a sixth of a SubmitJob's CPU for nothing.
    # OTEL_TRACES_SAMPLER, when set, decides as the OpenTelemetry SDK documents.
    sampler = None if otlp is not None or os.environ.get("OTEL_TRACES_SAMPLER") else ALWAYS_OFF
    provider = TracerProvider(resource=resource, sampler=sampler)
    readers: list[MetricReader] = []
    if otlp is not None:
        provider.add_span_processor(BatchSpanProcessor(span_exporter(otlp)))
        # Refusals by gate, actions by net, provider calls: exported beside the traces.
        readers.append(PeriodicExportingMetricReader(metric_exporter(otlp)))
    if scrape is not None:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader

        # A pull reader: it costs nothing until a scrape collects.
        readers.append(PrometheusMetricReader(registry=scrape))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def meter(name: str) -> metrics.Meter:
    return metrics.get_meter(name)
