"""The export to the collector follows the process's certificate files: after the files are
renewed, the next export of spans and of metrics comes with the new certificate.

The exporters are the ones a process builds from its settings (``Settings.otlp_target``,
``telemetry.span_exporter`` / ``metric_exporter``); the collector is real gRPC with mutual
TLS on loopback and records the serial of the certificate each export came with.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace.export import SpanExportResult

from gpufleet.common import telemetry
from gpufleet.common.settings import BaseServiceSettings
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import TlsFiles
from tests.integration.telemetry.test_otlp_trust import a_span
from tests.support import tls
from tests.support.otlp_collector import Collector


class SerialsSeen(Collector):
    """The tests' collector, also recording which certificate each export came with."""

    def __init__(self) -> None:
        super().__init__()
        self.serials: list[tuple[str, int]] = []

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        pem = context.auth_context()["x509_pem_cert"][0]
        kind = "spans" if isinstance(request, trace_service_pb2.ExportTraceServiceRequest) else "metrics"
        with self.lock:
            self.serials.append((kind, x509.load_pem_x509_certificate(pem).serial_number))
        return super().Export(request, context)


@contextmanager
def serve() -> Iterator[tuple[SerialsSeen, int]]:
    sink = SerialsSeen()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(sink, server)
    port = tls.transport("collector").add_port(server, "127.0.0.1:0")
    server.start()
    try:
        yield sink, port
    finally:
        server.stop(0)


def issue(folder: Path) -> int:
    files = TlsFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key")
    tls.authority().issue(Identity(Role.REAPER, tls.DEFAULT_DEPLOYMENT), files)
    return x509.load_pem_x509_certificate(files.cert.read_bytes()).serial_number


def settings(folder: Path, port: int) -> BaseServiceSettings:
    return BaseServiceSettings(
        otlp_endpoint=f"127.0.0.1:{port}",
        otlp_trust="deployment",
        deployment_id=tls.DEFAULT_DEPLOYMENT,
        tls_ca_file=str(folder / "ca.crt"),
        tls_cert_file=str(folder / "tls.crt"),
        tls_key_file=str(folder / "tls.key"),
    )


def test_spans_and_metrics_leave_with_the_renewed_certificate(tmp_path: Path) -> None:
    folder = tmp_path / "reaper"
    first = issue(folder)
    with serve() as (sink, port):
        config = settings(folder, port)
        target = config.otlp_target(config.transport("reaper"))
        assert target is not None and target.follow is not None

        spans = telemetry.span_exporter(target, timeout=5)
        assert isinstance(spans, telemetry.FollowingSpanExporter)
        metrics = telemetry.metric_exporter(target, timeout=5)
        assert isinstance(metrics, telemetry.FollowingMetricExporter)
        # What the reader is told to aggregate is what the OTLP exporter itself asks for.
        plain: Any = OTLPMetricExporter(**target.exporter_args())
        assert metrics._preferred_temporality == plain._preferred_temporality
        kinds = {k: type(v) for k, v in (metrics._preferred_aggregation or {}).items()}  # no __eq__
        assert kinds == {k: type(v) for k, v in plain._preferred_aggregation.items()}
        plain.shutdown()
        reader = PeriodicExportingMetricReader(metrics, export_interval_millis=3_600_000)
        provider = MeterProvider(metric_readers=[reader])
        counter = provider.get_meter("rotation-test").create_counter("rotation_test_total")
        try:
            assert spans.export(a_span()) is SpanExportResult.SUCCESS
            counter.add(1)
            assert reader.force_flush(10_000)

            second = issue(folder)
            assert target.follow.check()  # the process reads its files again (once a second)
            assert spans.export(a_span()) is SpanExportResult.SUCCESS
            counter.add(1)
            assert reader.force_flush(10_000)
            assert (spans.rebuilt.rebuilt, metrics.rebuilt.rebuilt) == (1, 1)
        finally:
            provider.shutdown()
            spans.shutdown()

    assert sink.serials[:4] == [
        ("spans", first),
        ("metrics", first),
        ("spans", second),
        ("metrics", second),
    ]
    assert set(sink.serials[4:]) <= {("metrics", second)}  # the provider's last collection at shutdown
    assert "rotation_test_total" in sink.metrics and sink.senders == {"reaper"}
