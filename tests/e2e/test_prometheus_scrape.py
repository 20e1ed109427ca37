"""Prometheus itself scrapes a real `gpufleet up` from the configuration `up` wrote, with no
editing: every service's target is up over mutual TLS, and a job submitted through the CLI
is counted in PromQL. A scrape without the scraper's certificate, or with another part's,
is refused.

Needs Debian's `prometheus` package (`scripts/bootstrap --dev` installs it as root); without
it this test fails, never skips: CI must not pass without having scraped.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpufleet.common.metrics.catalog import JOBS_SUBMITTED
from gpufleet.common.trust.pki import TlsFiles
from tests.support import scrape
from tests.support.ports import free_block
from tests.support.postgres import free_port

pytestmark = pytest.mark.e2e

GPUFLEET = [sys.executable, "-m", "gpufleet.cli"]
SERVICES = ("provisioner", "scheduler", "reaper", "sweeper")
# The scheduler's count of jobs SubmitJob accepted, as Prometheus names it (the catalogue's).
SUBMITTED = JOBS_SUBMITTED.prometheus_name
SUBMITTED_JOBS = 2
T = TypeVar("T")


def binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"`{name}` is not installed: `scripts/bootstrap --dev` installs Debian's prometheus "
            "package when run as root (apt-get install prometheus)"
        )
    return found


@dataclass
class Up:
    state_dir: Path
    scheduler: str
    metrics_ports: dict[str, int]

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*GPUFLEET, *args, "--scheduler", self.scheduler, "--state-dir", str(self.state_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`gpufleet up` on free ports, scraped every second."""
    base = free_block(4)
    metrics_base = free_block(4, exclude=range(base, base + 4))
    state_dir = tmp_path / "var"
    proc = subprocess.Popen(
        [
            *GPUFLEET,
            "up",
            "--state-dir",
            str(state_dir),
            "--port-offset",
            str(base - 50051),
            "--metrics-port-offset",
            str(metrics_base - 9451),
            "--scrape-interval",
            "1",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 90
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("ready.") or proc.poll() is not None:
                break
        assert any(line.startswith("ready.") for line in lines), "".join(lines)
        ports = {
            name: metrics_base + i for i, name in enumerate(("scheduler", "reaper", "provisioner", "sweeper"))
        }
        yield Up(state_dir, f"127.0.0.1:{base}", ports)
    finally:
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=60)
        if proc.poll() is None:
            proc.kill()
        # Local machines outlive `up` on purpose (the next one adopts them); end them here.
        for pid_file in (state_dir / "machines").glob("*/disk/agent.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)


@pytest.fixture
def prometheus(up: Up, tmp_path: Path) -> Iterator[str]:
    """The real Prometheus on the configuration `up` wrote, as the README runs it; its URL."""
    config = up.state_dir / "prometheus.yml"
    checked = subprocess.run(
        [binary("promtool"), "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    port = free_port()
    log = tmp_path / "prometheus.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 60, "Prometheus to be ready", lambda: log.read_text()[-3000:])
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def api(url: str, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}/api/v1/{path}{query}", timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return body["data"]


def wait_for(
    check: Callable[[], T | None], timeout: float, what: str, detail: Callable[[], object] = lambda: ""
) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {detail()}")


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
