"""Traces and metrics leave a real service process over OTLP: an in-test OTLP collector on
loopback receives each watchdog tick's span (with one event per decision naming the gate)
and the refusal/action counters."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from gpufleet.common.clock import FileClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from tests.support.fleet_rows import add_machine
from tests.support.procs import start_service
from tests.support.scripted_services import serve_provisioner


class Collector(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    """Records what arrives, as an OpenTelemetry collector would receive it."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, list[str]]] = []  # (service.name, span name, event names)
        self.metrics: set[str] = set()
        self.lock = threading.Lock()

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        with self.lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                for rs in request.resource_spans:
                    service = next(
                        (a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), ""
                    )
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            events = [
                                e.name
                                + ":"
                                + next(
                                    (a.value.string_value for a in e.attributes if a.key == "gpufleet.gate"),
                                    "",
                                )
                                for e in span.events
                            ]
                            self.spans.append((service, span.name, events))
                return trace_service_pb2.ExportTraceServiceResponse()
            for rm in request.resource_metrics:
                for sm in rm.scope_metrics:
                    self.metrics.update(m.name for m in sm.metrics)
            return metrics_service_pb2.ExportMetricsServiceResponse()


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    sink = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield sink, port
    server.stop(0)


def test_watchdog_ticks_export_spans_and_metrics(
    collector: tuple[Collector, int], pg_url: str, tmp_path: Path
) -> None:
    sink, port = collector
    clock = FileClock.create(tmp_path / "clock", datetime(2026, 6, 1, 9, 0, tzinfo=UTC))
    # A machine the money chain must refuse (a registered box with a timer due), so that a
    # tick carries a decision event naming its gate.
    add_machine(
        make_sessionmaker(make_engine(pg_url)),
        clock.now(),
        origin="REGISTERED",
        managed=False,
        stop_due_at=clock.now(),
    )
    with serve_provisioner() as provisioner:
        reaper = start_service(
            "reaper",
            tmp_path,
            {
                "GPUFLEET_DATABASE_URL": pg_url,
                "GPUFLEET_PROVISIONER_ADDRESS": provisioner.address,
                "GPUFLEET_CLOCK": "file",
                "GPUFLEET_CLOCK_FILE": str(clock.path),
                "GPUFLEET_OTLP_ENDPOINT": f"127.0.0.1:{port}",
                "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_METRIC_EXPORT_INTERVAL": "300",
            },
        )
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                clock.advance(30)
                with sink.lock:
                    names = {name for _, name, _ in sink.spans}
                    refused = [
                        events
                        for _, name, events in sink.spans
                        if name == "reaper.auto_stop.tick" and "refused:NOT_OURS" in events
                    ]
                    metric_names = set(sink.metrics)
                if refused and "gpufleet.reaper.refusals" in metric_names:
                    break
                time.sleep(0.2)
        finally:
            reaper.stop()
    assert {"reaper.idle_scanner.tick", "reaper.auto_stop.tick", "reaper.went_silent.tick"} <= names
    assert all(service == "gpufleet-reaper" for service, _, _ in sink.spans)
    assert refused, f"no auto_stop span with a NOT_OURS decision event: {sink.spans[:5]}"
    assert "gpufleet.reaper.refusals" in metric_names
