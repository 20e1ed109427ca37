"""A part's metrics listener over real TLS on loopback: the deployment's `metrics` identity
is answered with the OpenTelemetry metrics in Prometheus' text format, every other caller
is refused, and a real service process serves them while it also exports over OTLP."""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry

from gpufleet.common.clock import FileClock
from gpufleet.common.db.engine import make_engine, make_sessionmaker
from gpufleet.common.metrics.catalog import REAPER_REFUSALS
from gpufleet.common.metrics_listener import MetricsAddressError, MetricsListener, serve_metrics
from gpufleet.common.trust.identity import Role
from gpufleet.common.trust.transport import Transport
from tests.support import scrape, tls
from tests.support.fleet_rows import add_machine
from tests.support.otlp_collector import Collector, serve_collector
from tests.support.postgres import free_port
from tests.support.procs import start_service
from tests.support.scripted_services import serve_provisioner

SCHEDULER_NAME = "scheduler.gpufleet.local"


@pytest.fixture
def registry() -> CollectorRegistry:
    """A registry fed by a meter provider of its own (the process's global one untouched),
    with one counted submission."""
    registry = CollectorRegistry(auto_describe=True)
    provider = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    counter = provider.get_meter("test").create_counter("gpufleet.jobs.submitted")
    counter.add(3, {"pool": "l4"})
    return registry


@pytest.fixture
def listener(registry: CollectorRegistry) -> Iterator[MetricsListener]:
    served = serve_metrics("127.0.0.1:0", registry, tls.transport(Role.SCHEDULER))
    yield served
    served.close()


def as_(who: str | Role, deployment: str = tls.DEFAULT_DEPLOYMENT) -> ssl.SSLContext:
    return scrape.client_context(str(tls.files(who).ca), tls.files(who, deployment))


def test_the_metrics_identity_reads_the_metrics_in_prometheus_text_format(listener: MetricsListener) -> None:
    answer = scrape.get(listener.port, context=as_(Role.METRICS), server_name=SCHEDULER_NAME)
    assert answer.status == 200
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert "# TYPE gpufleet_jobs_submitted_total counter" in answer.body
    assert scrape.sample(answer.body, "gpufleet_jobs_submitted_total", pool="l4") == 3.0
    assert listener.url == f"https://127.0.0.1:{listener.port}/metrics"


@pytest.mark.parametrize("who", [Role.SCHEDULER, Role.OPERATOR, Role.COLLECTOR, "machine:box-1"])
def test_every_other_identity_of_the_deployment_is_refused(
    listener: MetricsListener, who: str | Role
) -> None:
    answer = scrape.get(listener.port, context=as_(who), server_name=SCHEDULER_NAME)
    assert answer.status == 403
    assert "gpufleet_jobs_submitted_total" not in answer.body


def test_a_caller_without_a_certificate_is_refused_in_the_handshake(listener: MetricsListener) -> None:
    context = scrape.client_context(str(tls.files(Role.METRICS).ca), None)
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        scrape.get(listener.port, context=context, server_name=SCHEDULER_NAME)


def test_a_metrics_certificate_of_another_deployment_is_refused_in_the_handshake(
    listener: MetricsListener,
) -> None:
    # It trusts our CA (it could check who answers); we do not trust its.
    stranger = scrape.client_context(str(tls.files(Role.METRICS).ca), tls.files(Role.METRICS, "other"))
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        scrape.get(listener.port, context=stranger, server_name=SCHEDULER_NAME)


def test_the_listener_proves_its_own_part(listener: MetricsListener) -> None:
    """A scraper that means the reaper is not answered by the scheduler."""
    with pytest.raises(ssl.SSLCertVerificationError):
        scrape.get(listener.port, context=as_(Role.METRICS), server_name="reaper.gpufleet.local")


def test_only_the_metrics_path_is_served(listener: MetricsListener) -> None:
    answer = scrape.get(listener.port, context=as_(Role.METRICS), server_name=SCHEDULER_NAME, path="/")
    assert answer.status == 404


def test_a_silent_connection_does_not_hold_up_a_scrape(listener: MetricsListener) -> None:
    """The handshake runs in each connection's own thread, not in the accepting one."""
    with socket.create_connection(("127.0.0.1", listener.port)):
        started = time.monotonic()
        answer = scrape.get(listener.port, context=as_(Role.METRICS), server_name=SCHEDULER_NAME, timeout=5)
        assert answer.status == 200
        assert time.monotonic() - started < 5


def test_an_insecure_process_serves_plaintext_to_anyone(
    registry: CollectorRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    served = serve_metrics("127.0.0.1:0", registry, Transport("local", None))
    try:
        answer = scrape.get(served.port, context=None)
    finally:
        served.close()
    assert answer.status == 200
    assert scrape.sample(answer.body, "gpufleet_jobs_submitted_total", pool="l4") == 3.0
    assert served.url.startswith("http://")
    assert any("PLAINTEXT" in r.getMessage() for r in caplog.records)


def test_a_taken_address_and_a_malformed_one_are_errors(
    listener: MetricsListener, registry: CollectorRegistry
) -> None:
    with pytest.raises(OSError):
        serve_metrics(f"127.0.0.1:{listener.port}", registry, tls.transport(Role.SCHEDULER))
    for address in ("9451", "localhost", "127.0.0.1:http", ":9451", "127.0.0.1:70000"):
        with pytest.raises(MetricsAddressError):
            serve_metrics(address, registry, tls.transport(Role.SCHEDULER))


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    with serve_collector(tls.transport("collector")) as served:
        yield served


def test_a_service_serves_its_metrics_while_it_exports_them_over_otlp(
    collector: tuple[Collector, int], pg_url: str, tmp_path: Path
) -> None:
    """One meter provider, two readers: the OTLP export and the scrape see the same counter."""
    sink, otlp_port = collector
    clock = FileClock.create(tmp_path / "clock", datetime(2026, 6, 1, 9, 0, tzinfo=UTC))
    # A registered box with a stop due: the money chain refuses it (NOT_OURS) on every tick.
    add_machine(
        make_sessionmaker(make_engine(pg_url)),
        clock.now(),
        origin="REGISTERED",
        managed=False,
        stop_due_at=clock.now(),
    )
    metrics_port = free_port()
    with serve_provisioner() as provisioner:
        reaper = start_service(
            "reaper",
            tmp_path,
            {
                "GPUFLEET_DATABASE_URL": pg_url,
                "GPUFLEET_PROVISIONER_ADDRESS": provisioner.address,
                "GPUFLEET_CLOCK": "file",
                "GPUFLEET_CLOCK_FILE": str(clock.path),
                "GPUFLEET_OTLP_ENDPOINT": f"127.0.0.1:{otlp_port}",
                "OTEL_METRIC_EXPORT_INTERVAL": "300",
                "GPUFLEET_METRICS_ADDRESS": f"127.0.0.1:{metrics_port}",
            },
        )
        try:
            scraped: float | None = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                clock.advance(30)
                answer = scrape.get(
                    metrics_port, context=as_(Role.METRICS), server_name="reaper.gpufleet.local"
                )
                scraped = scrape.sample(answer.body, REAPER_REFUSALS.prometheus_name)
                with sink.lock:
                    exported = REAPER_REFUSALS.name in sink.metrics
                if scraped and exported:
                    break
                time.sleep(0.2)
        finally:
            reaper.stop()
    assert scraped, f"no refusal counted on the scrape:\n{answer.body[:2000]}"
    assert exported, "the OTLP export stopped when the scrape began"
    assert '"metrics served at https://' in reaper.log()


def test_a_service_whose_metrics_address_is_taken_does_not_start(tmp_path: Path) -> None:
    """A metrics port another process holds is a configuration error, said at start."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        env = {
            **os.environ,
            **tls.env("provisioner"),
            "GPUFLEET_LISTEN_ADDRESS": "127.0.0.1:0",
            "GPUFLEET_LOCAL_ROOT": str(tmp_path / "machines"),
            "GPUFLEET_METRICS_ADDRESS": address,
        }
        done = subprocess.run(
            [sys.executable, "-m", "gpufleet.provisioner"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2
    assert f"cannot serve metrics on '{address}'" in done.stderr and "GPUFLEET_METRICS_ADDRESS" in done.stderr
