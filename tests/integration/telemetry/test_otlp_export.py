"""Traces and metrics leave a real service process over OTLP, with mutual TLS: an in-test
collector on loopback, proving the deployment's collector identity, receives each watchdog
tick's span (with one event per decision naming the gate) and the refusal/action counters,
from the reaper's own certificate."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.common.clock import FileClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from tests.support import tls
from tests.support.fleet_rows import add_machine
from tests.support.otlp_collector import Collector, serve_collector
from tests.support.procs import start_service
from tests.support.scripted_services import serve_provisioner


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    """The deployment's collector: mutual TLS, proving the collector identity."""
    with serve_collector(tls.transport("collector")) as served:
        yield served


# The spans of the nets this test expects to tick.
NETS = {"reaper.idle_scanner.tick", "reaper.auto_stop.tick", "reaper.went_silent.tick"}


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
                # Every net's span, not only auto_stop's: under load the others' exports can
                # come a batch later than the refusal that ends the wait.
                if refused and "gpufleet.reaper.refusals" in metric_names and names >= NETS:
                    break
                time.sleep(0.2)
        finally:
            reaper.stop()
    assert names >= NETS
    assert all(service == "gpufleet-reaper" for service, _, _ in sink.spans)
    assert refused, f"no auto_stop span with a NOT_OURS decision event: {sink.spans[:5]}"
    assert "gpufleet.reaper.refusals" in metric_names
    assert sink.senders == {"reaper"}, "every export came with the reaper's certificate"
