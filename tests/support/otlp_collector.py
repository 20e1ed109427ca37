"""An OpenTelemetry collector for tests: it records what arrives over OTLP/gRPC, and from
whom (the exporter's certificate), served with mutual TLS as a deployment's collector, with
another identity's certificate (an impostor), or in plaintext."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from gpufleet.common.trust.peer import identity_of
from gpufleet.common.trust.transport import Transport


class Collector(trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer):
    """Records what arrives, as an OpenTelemetry collector would receive it."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, list[str]]] = []  # (service.name, span name, event names)
        self.metrics: set[str] = set()
        self.senders: set[str] = set()  # the identities the exports came from ("" if none)
        self.lock = threading.Lock()

    def Export(self, request, context):  # type: ignore[no-untyped-def]
        sender = identity_of(context)
        with self.lock:
            self.senders.add(str(sender) if sender is not None else "")
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


@contextmanager
def serve_collector(transport: Transport | None) -> Iterator[tuple[Collector, int]]:
    """A collector on loopback: TLS with ``transport``'s certificate (callers must present one
    of the deployment's), or plaintext when None."""
    sink = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(sink, server)
    if transport is None:
        port = server.add_insecure_port("127.0.0.1:0")
    else:
        port = server.add_secure_port("127.0.0.1:0", transport.server_credentials())
    server.start()
    try:
        yield sink, port
    finally:
        server.stop(0)
