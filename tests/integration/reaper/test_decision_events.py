"""Each refusal is an event on the tick's span naming the gate (DESIGN §11)."""

from __future__ import annotations

from datetime import timedelta

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpufleet.reaper.auto_stop import AutoStop, AutoStopPolicy
from tests.integration.reaper.conftest import Chain
from tests.support.fleet_rows import add_attempt, add_machine


def test_refusals_are_span_events_naming_the_gate(chain: Chain) -> None:
    now = chain.clock.now()
    pinned = add_machine(chain.sessions, now, stop_due_at=now - timedelta(seconds=1))
    add_attempt(chain.sessions, now, pinned)
    registered = add_machine(chain.sessions, now, origin="REGISTERED", stop_due_at=now - timedelta(seconds=1))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    net = AutoStop(chain.sessions, chain.lease, chain.clock, chain.provisioner, AutoStopPolicy())  # type: ignore[arg-type]
    with provider.get_tracer("test").start_as_current_span("reaper.auto_stop.tick"):
        report = net.run(now)
    [span] = exporter.get_finished_spans()
    gates = {
        (e.attributes or {})["gpufleet.machine_id"]: (e.attributes or {})["gpufleet.gate"]
        for e in span.events
        if e.name == "refused"
    }
    assert gates == {pinned: "WORK_PINNED", registered: "NOT_OURS"}
    assert dict(report.refusals) == {"WORK_PINNED": 1, "NOT_OURS": 1}
