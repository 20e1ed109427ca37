"""The export to the collector is a connection like any other: by default both ends prove
who they are. An exporter sends only to a collector that proves the deployment's collector
identity, and the collector sees which part sent it; plaintext is asked for by name.

Each case exports one span through the exporter gpufleet builds from its settings
(``Settings.otlp_target``) and reads the export's result and what the collector received.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpufleet.common.settings import BaseServiceSettings
from gpufleet.common.telemetry import OtlpTarget
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import Authority
from gpufleet.common.trust.transport import Transport
from tests.support import tls
from tests.support.otlp_collector import Collector, serve_collector


def a_span() -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("trust-test").start_as_current_span("work"):
        pass
    return list(memory.get_finished_spans())


def target(port: int, trust: str, **extra: str) -> OtlpTarget:
    settings = BaseServiceSettings(
        otlp_endpoint=f"127.0.0.1:{port}",
        otlp_trust=trust,  # type: ignore[arg-type]
        **tls.settings("reaper"),  # type: ignore[arg-type]
        **extra,  # type: ignore[arg-type]
    )
    found = settings.otlp_target(settings.transport("reaper"))
    assert found is not None
    return found


def export(to: OtlpTarget) -> SpanExportResult:
    exporter = OTLPSpanExporter(**to.exporter_args(), timeout=3)
    try:
        return exporter.export(a_span())
    finally:
        exporter.shutdown()


def received(sink: Collector) -> int:
    with sink.lock:
        return len(sink.spans)


def test_the_deployments_collector_receives_and_knows_the_sender() -> None:
    with serve_collector(tls.transport("collector")) as (sink, port):
        assert export(target(port, "deployment")) is SpanExportResult.SUCCESS
    assert received(sink) == 1
    assert sink.senders == {"reaper"}


def test_a_part_of_the_deployment_that_is_no_collector_gets_nothing() -> None:
    with serve_collector(tls.transport("sweeper")) as (sink, port):
        assert export(target(port, "deployment")) is SpanExportResult.FAILURE
    assert received(sink) == 0


def test_a_collector_of_another_ca_gets_nothing(tmp_path: Path) -> None:
    other = Authority.ensure(tmp_path / "other", tls.DEFAULT_DEPLOYMENT)
    impostor = Transport(
        tls.DEFAULT_DEPLOYMENT, other.ensure_part(Identity(Role.COLLECTOR, tls.DEFAULT_DEPLOYMENT))
    )
    with serve_collector(impostor) as (sink, port):
        assert export(target(port, "deployment")) is SpanExportResult.FAILURE
    assert received(sink) == 0


def test_a_plaintext_collector_gets_nothing_unless_plaintext_is_asked_for() -> None:
    with serve_collector(None) as (sink, port):
        assert export(target(port, "deployment")) is SpanExportResult.FAILURE
        assert received(sink) == 0
        asked = target(port, "plaintext")
        assert asked.plaintext_warning is not None and "PLAINTEXT" in asked.plaintext_warning
        assert export(asked) is SpanExportResult.SUCCESS
    assert received(sink) == 1
    assert sink.senders == {""}  # no certificate came with it


def test_system_trust_does_not_take_the_deployments_private_ca() -> None:
    with serve_collector(tls.transport("collector")) as (sink, port):
        assert export(target(port, "system")) is SpanExportResult.FAILURE
    assert received(sink) == 0


def test_an_insecure_process_exports_in_plaintext_and_says_so_on_every_line() -> None:
    settings = BaseServiceSettings(otlp_endpoint="127.0.0.1:4317", insecure=True)
    found = settings.otlp_target(Transport("local", None))
    assert found == OtlpTarget("127.0.0.1:4317", None)


def test_no_endpoint_no_export() -> None:
    settings = BaseServiceSettings(**tls.settings("reaper"))  # type: ignore[arg-type]
    assert settings.otlp_target(settings.transport("reaper")) is None


@pytest.mark.parametrize("trust", ["deployment", "system", "plaintext"])
def test_the_trust_setting_is_read_from_the_environment(trust: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_OTLP_TRUST", trust)
    assert BaseServiceSettings().otlp_trust == trust
