"""`gpufleet up` writes `<state dir>/prometheus.yml`: one HTTPS job per service at its metrics
address, each target's name checked, the scraper's certificate sent; written whole."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from gpufleet.cli.main import main
from gpufleet.cli.prometheus_config import ScrapeTarget, prometheus_duration, render, write_atomically
from gpufleet.cli.stack import DEFAULT_METRICS_PORTS, SCRAPER, SERVICES, Stack, StackConfig
from gpufleet.common.trust.identity import Role
from gpufleet.common.trust.peer import identity_from_auth_context
from gpufleet.common.trust.pki import TlsFiles


def stack(state_dir: Path, metrics_ports: dict[str, int], interval: float = 15.0) -> Stack:
    ports = {name: 50051 + i for i, name in enumerate(SERVICES)}
    return Stack(
        StackConfig(state_dir=state_dir, ports=ports, metrics_ports=metrics_ports, scrape_interval_s=interval)
    )


def test_one_https_job_per_service_checking_its_name_with_the_scrapers_certificate(tmp_path: Path) -> None:
    s = stack(tmp_path / "var", {name: 9451 + i for i, name in enumerate(SERVICES)}, interval=2)
    authority = s.ensure_credentials()
    path = s.write_prometheus_config(authority)
    assert path == tmp_path / "var" / "prometheus.yml"
    config = yaml.safe_load(path.read_text())
    assert config["global"] == {"scrape_interval": "2s", "scrape_timeout": "2s"}
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert sorted(jobs) == sorted(f"gpufleet-{name}" for name in SERVICES)
    for i, name in enumerate(SERVICES):
        job = jobs[f"gpufleet-{name}"]
        assert job["scheme"] == "https" and job["metrics_path"] == "/metrics"
        assert job["static_configs"] == [{"targets": [f"127.0.0.1:{9451 + i}"], "labels": {"service": name}}]
        tls_config = job["tls_config"]
        assert tls_config["server_name"] == f"{name}.gpufleet.local"
        assert all(Path(tls_config[k]).is_absolute() for k in ("ca_file", "cert_file", "key_file"))
        assert tls_config["ca_file"] == str(authority.ca_path.resolve())
    # The deployment's alert rules are written beside it and loaded from there.
    assert config["rule_files"] == [str((tmp_path / "var" / "alerts.yml").resolve())]
    repo_rules = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "alerts.yml"
    assert (tmp_path / "var" / "alerts.yml").read_text() == repo_rules.read_text()
    # The scraper's certificate is the deployment's metrics identity.
    cert = Path(jobs["gpufleet-scheduler"]["tls_config"]["cert_file"]).read_bytes()
    leaf = cert.split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"
    scraper = identity_from_auth_context({"x509_pem_cert": [leaf]})
    assert scraper is not None and scraper.role is Role.METRICS and scraper.deployment == "local"


def test_a_service_without_a_metrics_port_gets_an_empty_address_and_no_job(tmp_path: Path) -> None:
    s = stack(tmp_path, {"scheduler": 9451})
    assert s.config.metrics_address("reaper") == ""
    config = yaml.safe_load(s.write_prometheus_config(s.ensure_credentials()).read_text())  # type: ignore[union-attr]
    assert [job["job_name"] for job in config["scrape_configs"]] == ["gpufleet-scheduler"]
    # The demo's stack serves no metrics: nothing to write.
    assert stack(tmp_path / "demo", {}).write_prometheus_config(s.ensure_credentials()) is None


@pytest.mark.parametrize(
    ("seconds", "text"), [(15, "15s"), (1, "1s"), (0.5, "500ms"), (1.5, "1500ms"), (120, "120s")]
)
def test_durations_in_prometheus_syntax(seconds: float, text: str) -> None:
    assert prometheus_duration(seconds) == text


@pytest.mark.parametrize("seconds", [0, -1, 0.0001])
def test_a_scrape_interval_is_positive(seconds: float) -> None:
    with pytest.raises(ValueError):
        prometheus_duration(seconds)


def test_a_scrape_may_not_outlast_its_interval_nor_prometheus_default_timeout() -> None:
    files = TlsFiles(Path("/ca.crt"), Path("/m.crt"), Path("/m.key"))
    target = [ScrapeTarget("scheduler", "127.0.0.1:9451", "scheduler.gpufleet.local")]
    assert yaml.safe_load(render(target, files, 60))["global"]["scrape_timeout"] == "10s"
    assert yaml.safe_load(render(target, files, 0.5))["global"]["scrape_timeout"] == "500ms"


def test_paths_with_any_character_stay_one_yaml_string() -> None:
    odd = Path('/srv/my "fleet": #1/tls')
    files = TlsFiles(odd / "ca.crt", odd / "metrics.crt", odd / "metrics.key")
    target = [ScrapeTarget("scheduler", "127.0.0.1:9451", "scheduler.gpufleet.local")]
    job = yaml.safe_load(render(target, files))["scrape_configs"][0]
    assert job["tls_config"]["ca_file"] == str(odd / "ca.crt")


def test_the_file_is_replaced_whole(tmp_path: Path) -> None:
    """A reader of the old file keeps reading all of it; the new one appears at once, and no
    temporary file is left beside it."""
    path = tmp_path / "prometheus.yml"
    write_atomically(path, "old: 1\n" * 1000)
    with open(path) as reading:
        write_atomically(path, "new: 2\n")
        assert reading.read() == "old: 1\n" * 1000
    assert path.read_text() == "new: 2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["prometheus.yml"]


def test_the_scrapers_certificate_is_made_with_the_others(tmp_path: Path) -> None:
    authority = stack(tmp_path, {}).ensure_credentials()
    assert authority.files(SCRAPER).cert.exists() and authority.files(SCRAPER).key.exists()


@pytest.mark.parametrize("name", SERVICES)
def test_up_puts_each_metrics_listener_where_the_service_would_by_default(name: str) -> None:
    """Two places name the default ports (the CLI may not import a service): kept equal here."""
    settings = importlib.import_module(f"gpufleet.{name}.settings").Settings
    assert settings.model_fields["metrics_address"].default == f"127.0.0.1:{DEFAULT_METRICS_PORTS[name]}"


def test_an_agent_serves_no_metrics_unless_told() -> None:
    """A local machine runs with the provisioner's environment, beside other local machines."""
    from gpufleet.agent.settings import Settings

    field = Settings.model_fields["metrics_address"]
    assert field.default == "" and field.validation_alias == "GPUFLEET_AGENT_METRICS_ADDRESS"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--port-offset", "-45000"], "out of range"),
        (["--port-offset", "-50051", "--metrics-port-offset", "0"], "out of range"),
        (["--metrics-port-offset", "60000"], "out of range"),
        (["--scrape-interval", "0"], "--scrape-interval"),
    ],
)
def test_up_refuses_ports_out_of_range_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["up", "--state-dir", str(tmp_path / "var"), *args])
    assert done.value.code == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "var").exists()
