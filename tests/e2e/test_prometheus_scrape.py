"""Prometheus itself scrapes a real `gpufleet up` from the configuration `up` wrote, with no
editing: every service's target is up over mutual TLS, and a job submitted through the CLI
is counted in PromQL. A scrape without the scraper's certificate, or with another part's,
is refused.

Needs Debian's `prometheus` package (`scripts/bootstrap --dev` installs it as root); without
it this test fails, never skips: CI must not pass without having scraped.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.common.metrics.catalog import JOBS_SUBMITTED
from gpufleet.common.trust.pki import TlsFiles
from tests.e2e.prometheus_stack import SERVICES, Up, api, gpufleet_up, prometheus_for, wait_for
from tests.support import scrape

pytestmark = pytest.mark.e2e

# The scheduler's count of jobs SubmitJob accepted, as Prometheus names it (the catalogue's).
SUBMITTED = JOBS_SUBMITTED.prometheus_name
SUBMITTED_JOBS = 2


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    with gpufleet_up(tmp_path) as stack:
        yield stack


@pytest.fixture
def prometheus(up: Up, tmp_path: Path) -> Iterator[str]:
    with prometheus_for(up, tmp_path) as url:
        yield url


def test_prometheus_scrapes_every_service_from_the_config_up_wrote(up: Up, prometheus: str) -> None:
    for _ in range(SUBMITTED_JOBS):
        submitted = up.cli("submit", "--workspace", "acme-studio", "--kind", "short_episode")
        assert submitted.returncode == 0, submitted.stderr

    def targets() -> list[dict[str, Any]]:
        return list(api(prometheus, "targets", state="active")["activeTargets"])

    def all_up() -> bool:
        found = targets()
        return len(found) == len(SERVICES) and all(t["health"] == "up" for t in found)

    wait_for(all_up, 60, "every target up", lambda: [(t["labels"], t["lastError"]) for t in targets()])
    assert {t["labels"]["job"] for t in targets()} == {f"gpufleet-{name}" for name in SERVICES}
    assert {t["scrapeUrl"] for t in targets()} == {
        f"https://127.0.0.1:{port}/metrics" for port in up.metrics_ports.values()
    }

    def submitted_total() -> float | None:
        result = api(prometheus, "query", query=f'sum({SUBMITTED}{{job="gpufleet-scheduler"}})')["result"]
        return float(result[0]["value"][1]) if result else None

    wait_for(
        lambda: submitted_total() == SUBMITTED_JOBS,
        30,
        f"{SUBMITTED} to reach {SUBMITTED_JOBS}",
        submitted_total,
    )
    by_pool = api(prometheus, "query", query=f"sum by (pool) ({SUBMITTED})")["result"]
    assert [(r["metric"], float(r["value"][1])) for r in by_pool] == [({"pool": "l4"}, float(SUBMITTED_JOBS))]
    # The deployment's alert rules are loaded and evaluated (deploy/prometheus/alerts.yml,
    # written beside the configuration): the Alerts page shows them.
    groups = api(prometheus, "rules", type="alert")["groups"]
    loaded = {r["name"] for g in groups for r in g["rules"]}
    assert {"GpufleetFleetTickNotRunning", "GpufleetCloudRefusesEveryCreate"} <= loaded, groups
    assert all(r["health"] != "err" for g in groups for r in g["rules"]), groups
    # Each service said who it is (OpenTelemetry's resource, as target_info).
    names = api(prometheus, "query", query="target_info")["result"]
    assert {r["metric"]["job"]: r["metric"]["service_name"] for r in names}.get(
        "gpufleet-scheduler"
    ) == "gpufleet-scheduler"


def test_a_scrape_without_the_scrapers_certificate_is_refused(up: Up) -> None:
    tls_dir = up.state_dir / "tls"
    ca = str(tls_dir / "ca.crt")
    port, name = up.metrics_ports["scheduler"], "scheduler.gpufleet.local"
    # The scraper's certificate is answered ...
    scraper = TlsFiles(tls_dir / "ca.crt", tls_dir / "metrics.crt", tls_dir / "metrics.key")
    answer = scrape.get(port, context=scrape.client_context(ca, scraper), server_name=name)
    assert answer.status == 200
    # ... the operator's (another part of the same deployment) is not ...
    operator = TlsFiles(tls_dir / "ca.crt", tls_dir / "operator.crt", tls_dir / "operator.key")
    refused = scrape.get(port, context=scrape.client_context(ca, operator), server_name=name)
    assert refused.status == 403 and SUBMITTED not in refused.body
    # ... and a caller with no certificate does not get past the handshake; nor does plaintext.
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        scrape.get(port, context=scrape.client_context(ca, None), server_name=name)
    with pytest.raises((ConnectionError, OSError)):
        scrape.get(port, context=None)
