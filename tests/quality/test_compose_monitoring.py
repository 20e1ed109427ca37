"""Prometheus and Grafana in docker-compose.yml, checked offline (no Docker engine here):
Prometheus scrapes every control-plane service's metrics listener where it serves, with
the same jobs and labels as `gpufleet up`'s configuration; its configuration, its
certificate (made by the compose file's own issuing steps) and its rules pass `promtool
check config` where the compose file mounts them; each job's TLS settings are answered by a
real metrics listener holding that service's certificate; Grafana is provisioned with that
Prometheus and the generated dashboards. Each reference check is also shown to fail on a
broken copy."""

from __future__ import annotations

import copy
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter

from gpufleet.cli import prometheus_config
from gpufleet.common.metrics_listener import serve_metrics
from gpufleet.common.trust import issue
from gpufleet.common.trust.identity import Identity, Role
from gpufleet.common.trust.pki import TlsFiles
from gpufleet.common.trust.transport import Transport
from tests.quality._deployfiles import (
    depends_on,
    environment,
    grafana_problems,
    load_compose,
    metrics_address,
    mounts,
    networks_of,
    prometheus_problems,
    scrape_targets,
)
from tests.quality._repo import REPO, run
from tests.support import scrape

PROMETHEUS_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
PROVISIONING = REPO / "deploy" / "grafana" / "provisioning"
DASHBOARDS = REPO / "deploy" / "grafana" / "dashboards"
PLACEHOLDER = "@DEPLOYMENT@"
SCRAPED = {"scheduler", "reaper", "sweeper", "provisioner"}
# Compose's ${NAME:-default}: what a variable the environment does not set becomes.
_DEFAULTED = re.compile(r"\$\{([A-Z_][A-Z0-9_]*):-([^}]*)\}")


def interpolate(text: str) -> str:
    """``text`` as compose reads it with none of its variables set."""
    return _DEFAULTED.sub(lambda m: m.group(2), text)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


@pytest.fixture(scope="module")
def deployment(compose: dict[str, Any]) -> str:
    return interpolate(compose["x-service-env"]["GPUFLEET_DEPLOYMENT_ID"])


def rendered(deployment: str) -> dict[str, Any]:
    """The configuration the prometheus container starts with (its placeholder filled)."""
    data = yaml.safe_load(PROMETHEUS_CONFIG.read_text().replace(PLACEHOLDER, deployment))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def config(deployment: str) -> dict[str, Any]:
    return rendered(deployment)


def yaml_file(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


# --- what Prometheus scrapes ------------------------------------------------------------------


def test_prometheus_scrapes_every_control_plane_service_where_its_metrics_listener_serves(
    compose: dict[str, Any], config: dict[str, Any]
) -> None:
    assert prometheus_problems(config, compose) == []
    services = compose["services"]
    serving = {name for name, svc in services.items() if metrics_address(svc) is not None}
    assert serving == SCRAPED
    assert {host for host, _port in scrape_targets(config).values()} == SCRAPED


def test_each_job_checks_its_services_own_certificate_name_and_calls_as_the_metrics_identity(
    config: dict[str, Any], deployment: str, tmp_path: Path
) -> None:
    """The jobs, their labels and their TLS shape are `gpufleet up`'s (one shape for the
    alerts and the dashboards wherever they run); only addresses and paths differ."""
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = [
        prometheus_config.ScrapeTarget(host, f"{host}:{port}", Identity(Role(host), deployment).server_name)
        for host, port in sorted(scrape_targets(config).values())
    ]
    scraper = TlsFiles(tmp_path / "ca.crt", tmp_path / "tls.crt", tmp_path / "tls.key")
    written = yaml.safe_load(prometheus_config.render(targets, scraper))
    assert config["global"]["scrape_interval"] == written["global"]["scrape_interval"]
    for theirs in written["scrape_configs"]:
        ours = jobs[theirs["job_name"]]
        for key in ("scheme", "metrics_path"):
            assert ours[key] == theirs[key], (theirs["job_name"], key)
        assert ours["tls_config"]["server_name"] == theirs["tls_config"]["server_name"]
        assert ours["static_configs"][0]["labels"] == theirs["static_configs"][0]["labels"]
        assert ours["static_configs"][0]["targets"] == theirs["static_configs"][0]["targets"]
    assert set(jobs) == {t.job for t in targets}


def _set(path: list[str], value: object) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        pytest.param(
            _set(["services", "reaper", "environment", "GPUFLEET_METRICS_ADDRESS"], "0.0.0.0:9999"),
            "job gpufleet-reaper scrapes reaper:9452, but its metrics listener is on 9999",
            id="wrong-port",
        ),
        pytest.param(
            _set(["services", "sweeper", "environment", "GPUFLEET_METRICS_ADDRESS"], "127.0.0.1:9454"),
            "job gpufleet-sweeper: sweeper serves metrics on 127.0.0.1 only",
            id="loopback-only",
        ),
        pytest.param(
            _set(["services", "provisioner", "networks"], ["control"]),
            "job gpufleet-provisioner: provisioner shares no network with prometheus",
            id="network-cut",
        ),
        pytest.param(
            lambda doc: doc["services"]["scheduler"]["environment"].pop("GPUFLEET_METRICS_ADDRESS"),
            "job gpufleet-scheduler: scheduler serves no metrics",
            id="no-listener",
        ),
        pytest.param(
            lambda doc: doc["services"].pop("reaper"),
            "job gpufleet-reaper: reaper is no service",
            id="no-such-service",
        ),
    ],
)
def test_a_scrape_that_cannot_reach_its_target_is_reported(
    compose: dict[str, Any], config: dict[str, Any], mutate: Callable[[dict[str, Any]], None], problem: str
) -> None:
    broken = copy.deepcopy(compose)
    mutate(broken)
    problems = prometheus_problems(config, broken)
    assert any(problem in p for p in problems), problems


# --- its certificate, configuration and rules, where the compose file puts them ---------------


def command_args(service: dict[str, Any], module: str) -> list[str]:
    """The arguments of ``python -m module`` in a service's command, interpolated."""
    argv = [interpolate(a) for a in service["command"]]
    assert argv[:3] == ["python", "-m", module], argv
    return argv[3:]


def issue_as_compose_does(compose: dict[str, Any], tls_volume: Path) -> None:
    """The certs step, then the metrics-cert step, into ``tls_volume`` — their own arguments,
    less ``--owner`` (who owns the files is the containers' matter, and may need root)."""
    for step in ("certs", "metrics-cert"):
        args = [
            f"--dir={tls_volume}" if a == "--dir=/tls" else a
            for a in command_args(compose["services"][step], "gpufleet.common.trust.issue")
            if not a.startswith("--owner=")
        ]
        assert f"--dir={tls_volume}" in args
        assert issue.main(args) == 0


def host_path(service: dict[str, Any], container_path: str, tls_volume: Path) -> Path:
    """Where a path inside the container lives here: the bind mount or the tls volume's
    folder mounted at the longest prefix of it."""
    best: tuple[str, Path] | None = None
    for entry in service["volumes"]:
        if isinstance(entry, dict):
            if entry.get("source") != "tls":
                continue
            target, source = entry["target"], tls_volume / entry["volume"]["subpath"]
        else:
            kind, src, target = mounts({"volumes": [entry]})[0]
            if kind != "bind":
                continue
            source = REPO / src
        if (container_path == target or container_path.startswith(target + "/")) and (
            best is None or len(target) > len(best[0])
        ):
            best = (target, source)
    assert best is not None, f"{container_path} is mounted from nowhere"
    target, source = best
    return source / container_path[len(target) :].lstrip("/") if container_path != target else source


@pytest.fixture(scope="module")
def tls_volume(compose: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tls")
    issue_as_compose_does(compose, folder)
    return folder


def test_the_metrics_certificate_is_issued_to_prometheus_alone(
    compose: dict[str, Any], tls_volume: Path
) -> None:
    services = compose["services"]
    certs_parts = next(a for a in services["certs"]["command"] if a.startswith("--parts="))
    assert "metrics" not in certs_parts.removeprefix("--parts=").split(",")
    assert command_args(services["metrics-cert"], "gpufleet.common.trust.issue")[-2:] == [
        "--parts=metrics",
        "--owner=65534",  # the prom/prometheus image's user (nobody), which has no `user:` here
    ]
    assert "user" not in services["prometheus"]
    assert depends_on(services["metrics-cert"]) == {"certs": "service_completed_successfully"}
    assert depends_on(services["prometheus"])["metrics-cert"] == "service_completed_successfully"
    holders = [
        name
        for name, svc in services.items()
        for v in svc.get("volumes") or []
        if isinstance(v, dict) and v.get("source") == "tls" and v["volume"]["subpath"] == "metrics"
    ]
    assert holders == ["prometheus"]
    assert (tls_volume / "metrics" / "tls.crt").is_file()


def test_prometheus_starts_from_its_config_with_the_deployment_filled_in(compose: dict[str, Any]) -> None:
    prometheus = compose["services"]["prometheus"]
    assert prometheus["entrypoint"] == ["/bin/sh", "-c"]
    (script,) = prometheus["command"]
    fill = re.match(r"sed 's/@DEPLOYMENT@/(\S+)/g' (\S+) > (\S+) && exec /bin/prometheus (.*)$", script)
    assert fill is not None, script
    deployment, source, written, flags = fill.groups()
    assert deployment == compose["x-service-env"]["GPUFLEET_DEPLOYMENT_ID"]
    assert ("bind", "./deploy/prometheus/prometheus.yml", source) in mounts(prometheus)
    assert f"--config.file={written}" in flags.split()
    (data,) = [t for kind, s, t in mounts(prometheus) if kind == "volume" and s == "prometheus-data"]
    assert Path(written).parent == Path(data)  # written where the image's user may write
    assert f"--storage.tsdb.path={data}" in flags.split()


def test_promtool_accepts_the_config_with_its_certificate_and_rules_where_they_are_mounted(
    compose: dict[str, Any], config: dict[str, Any], tls_volume: Path, tmp_path: Path
) -> None:
    """promtool reads every file the configuration names (rules, certificates): each is
    looked for where the compose file mounts it from."""
    prometheus = compose["services"]["prometheus"]
    located = copy.deepcopy(config)
    located["rule_files"] = [str(host_path(prometheus, p, tls_volume)) for p in config["rule_files"]]
    assert [Path(p).name for p in located["rule_files"]] == ["alerts.yml"]
    for job in located["scrape_configs"]:
        for key in ("ca_file", "cert_file", "key_file"):
            job["tls_config"][key] = str(host_path(prometheus, job["tls_config"][key], tls_volume))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(located))
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: scripts/bootstrap --dev installs Debian's prometheus (as root)")
    checked = run([promtool, "check", "config", str(tmp_path / "prometheus.yml")])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS" in checked.stdout and "alerts.yml" in checked.stdout, checked.stdout  # rules too


@pytest.fixture
def listeners(tls_volume: Path, deployment: str) -> Iterator[dict[str, int]]:
    """Each scraped service's real metrics listener on loopback, serving with the
    certificate the certs step made for it: service -> port."""
    registry = CollectorRegistry()
    Counter("gpufleet_jobs_submitted", "jobs", registry=registry).inc(2)
    served = {}
    try:
        for name in sorted(SCRAPED):
            folder = tls_volume / name
            transport = Transport(
                deployment, TlsFiles(folder / "ca.crt", folder / "tls.crt", folder / "tls.key")
            )
            served[name] = serve_metrics("127.0.0.1:0", registry, transport)
        yield {name: listener.port for name, listener in served.items()}
    finally:
        for listener in served.values():
            listener.close()


def test_each_jobs_tls_settings_are_answered_by_its_services_real_metrics_listener(
    compose: dict[str, Any], config: dict[str, Any], tls_volume: Path, listeners: dict[str, int]
) -> None:
    prometheus = compose["services"]["prometheus"]
    for job in config["scrape_configs"]:
        host, _port = scrape_targets({"scrape_configs": [job]})[job["job_name"]]
        tls_config = job["tls_config"]
        ca, cert, key = (
            host_path(prometheus, tls_config[k], tls_volume) for k in ("ca_file", "cert_file", "key_file")
        )
        context = scrape.client_context(str(ca), TlsFiles(ca, cert, key))
        answer = scrape.get(listeners[host], context=context, server_name=tls_config["server_name"])
        assert answer.status == 200, (job["job_name"], answer.body)
        assert scrape.sample(answer.body, "gpufleet_jobs_submitted_total") == 2.0
        # Another service's name is refused in the handshake: server_name pins the target.
        other = next(n for n in sorted(SCRAPED) if n != host)
        with pytest.raises(OSError):
            scrape.get(listeners[other], context=context, server_name=tls_config["server_name"])


# --- Grafana ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def datasources() -> dict[str, Any]:
    return yaml_file(PROVISIONING / "datasources" / "prometheus.yml")


@pytest.fixture(scope="module")
def providers() -> dict[str, Any]:
    return yaml_file(PROVISIONING / "dashboards" / "gpufleet.yml")


def test_grafana_is_provisioned_with_the_prometheus_and_the_generated_dashboards(
    compose: dict[str, Any], config: dict[str, Any], datasources: dict[str, Any], providers: dict[str, Any]
) -> None:
    assert grafana_problems(datasources, providers, compose) == []
    grafana = compose["services"]["grafana"]
    assert ("bind", "./deploy/grafana/provisioning", "/etc/grafana/provisioning") in mounts(grafana)
    (source,) = datasources["datasources"]
    assert (source["type"], source["url"], source["isDefault"]) == (
        "prometheus",
        "http://prometheus:9090",
        True,
    )
    # $__rate_interval is at least four scrapes only if Grafana knows the scrape interval.
    assert source["jsonData"]["timeInterval"] == config["global"]["scrape_interval"]
    (provider,) = providers["providers"]
    assert ("bind", "./deploy/grafana/dashboards", provider["options"]["path"]) in mounts(grafana)
    assert len(list(DASHBOARDS.glob("*.json"))) == 3
    home = environment(grafana)["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home is not None and home.startswith(provider["options"]["path"] + "/")
    assert (DASHBOARDS / Path(home).name).is_file()


def test_grafana_reaches_prometheus_and_nothing_of_gpufleets(compose: dict[str, Any]) -> None:
    services = compose["services"]
    grafana_nets = networks_of(services["grafana"])
    reach = {n for n, s in services.items() if n != "grafana" and networks_of(s) & grafana_nets}
    assert reach == {"prometheus"}


def test_a_grafana_reference_that_resolves_nowhere_is_reported(
    compose: dict[str, Any], datasources: dict[str, Any], providers: dict[str, Any]
) -> None:
    broken_sources = copy.deepcopy(datasources)
    broken_sources["datasources"][0]["url"] = "http://prometheus-server:9090"
    broken_providers = copy.deepcopy(providers)
    broken_providers["providers"][0]["options"]["path"] = "/var/lib/grafana/dashboards"
    cut_off = copy.deepcopy(compose)
    cut_off["services"]["grafana"]["networks"] = ["telemetry"]
    cut_off["services"]["prometheus"]["networks"] = ["monitoring"]
    assert grafana_problems(broken_sources, broken_providers, compose) == [
        "datasource Prometheus: prometheus-server is no service",
        "dashboard provider gpufleet: /var/lib/grafana/dashboards is mounted into grafana from nowhere",
    ]
    assert grafana_problems(datasources, providers, cut_off) == [
        "datasource Prometheus: prometheus shares no network with grafana"
    ]


# --- images and exposure ------------------------------------------------------------------------


def test_every_image_pulled_is_pinned_to_a_version(compose: dict[str, Any]) -> None:
    for name, svc in compose["services"].items():
        if "build" in svc:
            continue
        image = svc["image"]
        _repo, _, tag = image.rpartition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: {image} is not pinned"


def test_prometheus_and_grafana_publish_on_loopback_only(compose: dict[str, Any]) -> None:
    """Neither asks who is looking: the fleet's costs stay on the operator's host."""
    services = compose["services"]
    assert services["prometheus"]["ports"] == ["127.0.0.1:9090:9090"]
    assert services["grafana"]["ports"] == ["127.0.0.1:3000:3000"]
    for name in SCRAPED:
        published = [str(p) for p in services[name].get("ports", [])]
        address = metrics_address(services[name])
        assert address is not None
        assert not any(str(address[1]) in p for p in published), f"{name} publishes its metrics port"
