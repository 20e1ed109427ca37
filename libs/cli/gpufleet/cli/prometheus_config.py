"""``<state dir>/prometheus.yml``: Prometheus' configuration for the system ``gpufleet up`` runs.

So that ``prometheus --config.file=<state dir>/prometheus.yml`` watches a local system with
no editing: one scrape job per service at its metrics address, over HTTPS, checking that
each target proves its own service's name (``server_name``: whatever address answers, only
the scheduler may answer for the scheduler) and calling with the scraper's certificate, the
only identity a metrics listener answers. Paths are absolute: Prometheus may run from any
folder. Rewritten on every start (the ports follow ``--port-offset``); edits are lost.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpufleet.common.trust.pki import TlsFiles

DEFAULT_SCRAPE_INTERVAL_S = 15.0
# Prometheus' own default; a scrape may not outlast its interval.
_SCRAPE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ScrapeTarget:
    """One service's metrics listener, as Prometheus reaches it."""

    service: str
    address: str
    # The DNS name its certificate carries (Identity.server_name).
    server_name: str

    @property
    def job(self) -> str:
        return f"gpufleet-{self.service}"


def prometheus_duration(seconds: float) -> str:
    """Prometheus' duration syntax: ``15s``, ``500ms``."""
    if seconds <= 0:
        raise ValueError(f"a scrape interval is positive, not {seconds:g}s")
    millis = round(seconds * 1000)
    if millis < 1:
        raise ValueError(f"a scrape interval is at least 1ms, not {seconds:g}s")
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def _q(text: str) -> str:
    """A YAML double-quoted scalar (a JSON string is one): paths may hold any character."""
    return json.dumps(text)


# The alert rules a deployment's Prometheus loads (deploy/prometheus/alerts.yml), as the CLI
# package carries them; None where an install left them out.
def _packaged_rules() -> Path | None:
    path = Path(__file__).resolve().with_name("alerts.yml")
    return path if path.is_file() else None


ALERT_RULES = _packaged_rules()


def render(
    targets: Sequence[ScrapeTarget],
    scraper: TlsFiles,
    scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
    rule_files: Sequence[Path] = (),
) -> str:
    """The configuration's text (YAML): the scrape jobs, and the alert rules it evaluates
    (``rule_files``: shown on Prometheus' Alerts page; none is sent anywhere without an
    Alertmanager)."""
    interval = prometheus_duration(scrape_interval_s)
    timeout = prometheus_duration(min(scrape_interval_s, _SCRAPE_TIMEOUT_S))
    lines = [
        "# Written by `gpufleet up` for the system it runs; rewritten on every start (edits are lost).",
        "# Run: prometheus --config.file=<this file> --storage.tsdb.path=<a data folder>",
        "# Each service serves /metrics over mutual TLS and answers only the deployment's",
        '# `metrics` identity: the certificate below (README "Metrics").',
        "global:",
        f"  scrape_interval: {interval}",
        f"  scrape_timeout: {timeout}",
    ]
    if rule_files:
        lines.append("rule_files:")
        lines += [f"  - {_q(str(path.resolve()))}" for path in rule_files]
    lines.append("scrape_configs:")
    for target in targets:
        lines += [
            f"  - job_name: {_q(target.job)}",
            "    scheme: https",
            "    metrics_path: /metrics",
            "    tls_config:",
            f"      ca_file: {_q(str(scraper.ca.resolve()))}",
            f"      cert_file: {_q(str(scraper.cert.resolve()))}",
            f"      key_file: {_q(str(scraper.key.resolve()))}",
            f"      server_name: {_q(target.server_name)}",
            "    static_configs:",
            f"      - targets: [{_q(target.address)}]",
            f"        labels: {{service: {_q(target.service)}}}",
        ]
    return "\n".join(lines) + "\n"


def write_atomically(path: Path, text: str) -> None:
    """Whole or not at all: a Prometheus reloading its configuration never reads half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
