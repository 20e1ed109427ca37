"""Logging and OpenTelemetry set-up, shared by every process.

Logs are JSON lines carrying the current trace id, so a log line can be found from a
trace and the reverse. Traces export over OTLP when ``GPUFLEET_OTLP_ENDPOINT`` is set;
otherwise spans are still created (tests read them) but go nowhere. The export is a
connection like any other: by default mutual TLS to a collector that proves the
deployment's ``collector`` identity (:class:`OtlpTarget`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import grpc
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

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

    def exporter_args(self) -> dict[str, Any]:
        if self.credentials is None:
            return {"endpoint": self.endpoint, "insecure": True}
        options = (("grpc.ssl_target_name_override", self.server_name),) if self.server_name else None
        return {
            "endpoint": self.endpoint,
            "insecure": False,
            "credentials": self.credentials,
            "channel_options": options,
        }


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
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(**otlp.exporter_args())))
        # Refusals by gate, actions by net, provider calls: exported beside the traces.
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(**otlp.exporter_args())))
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
