"""Offline checks of the deployment files (no Docker engine here): each returns the list of
problems it finds, so a test can assert the real files have none and that a broken copy
has the one it was broken with."""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from tests.quality._repo import PACKAGE_DIRS, REPO

Compose = dict[str, Any]

# A cloud credential passed as environment or mounted as files: only the provisioner may.
CREDENTIAL_ENV = re.compile(r"^(AWS_|GOOGLE_|GCLOUD_|CLOUDSDK_|GCP_|AZURE_)")
CREDENTIAL_MOUNT = re.compile(r"(\.aws|gcloud|credentials|service[-_]account|\.azure)")


def load_compose(path: Path = REPO / "docker-compose.yml") -> Compose:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


# --- Dockerfiles ------------------------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def args(self, instruction: str) -> list[str]:
        return [a for i, a in self.instructions if i == instruction]


def parse_dockerfile(path: Path) -> list[Stage]:
    """The build stages of a Dockerfile: each FROM and the instructions after it."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    stages: list[Stage] = []
    for line in lines:
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = args.split()
            stages.append(Stage(base=words[0], name=words[2] if len(words) > 2 else None))
        elif stages:
            stages[-1].instructions.append((instruction, args.strip()))
    return stages


def exec_form(args: str) -> list[str]:
    """A JSON (exec form) argument list; a shell-form string is a problem for the caller."""
    value = json.loads(args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), args
    return value


def copy_sources(stage: Stage) -> list[str]:
    """Paths a stage COPYs from the build context (COPY --from=... is another stage)."""
    sources: list[str] = []
    for args in stage.args("COPY") + stage.args("ADD"):
        words = args.split()
        if any(w.startswith("--from=") for w in words):
            continue
        words = [w for w in words if not w.startswith("--")]
        sources.extend(w.rstrip("/") for w in words[:-1])
    return sources


def dockerignore_patterns() -> list[str]:
    path = REPO / ".dockerignore"
    return [
        line.strip()
        for line in path.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def dockerignored(rel: str, patterns: list[str]) -> bool:
    """Whether ``rel`` (or a folder above it) is left out of the build context."""
    parts = rel.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        for candidate in candidates:
            if fnmatch.fnmatch(candidate, pattern):
                return True
            if pattern.startswith("**/") and fnmatch.fnmatch(candidate.split("/")[-1], pattern[3:]):
                return True
    return False


def module_file(module: str) -> Path | None:
    """The file ``python -m module`` runs, found in the tree (``gpufleet.<portion>...``)."""
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != "gpufleet" or parts[1] not in PACKAGE_DIRS:
        return None
    base = REPO / PACKAGE_DIRS[parts[1]] / Path(*parts)
    for candidate in (base / "__main__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def dockerfile_problems(dockerfile: Path, command: list[str] | None = None) -> list[str]:
    """What would break this image: a missing or ignored COPY source, a root user, a shell-form
    CMD, a module that ``python -m`` cannot find among the packages the image installs."""
    problems: list[str] = []
    stages = parse_dockerfile(dockerfile)
    if not stages:
        return [f"{dockerfile}: no FROM"]
    ignored = dockerignore_patterns()
    installed_dirs: set[str] = set()
    for stage in stages:
        for src in copy_sources(stage):
            if not (REPO / src).exists():
                problems.append(f"{dockerfile}: COPY {src}: no such path in the repository")
            elif dockerignored(src, ignored):
                problems.append(f"{dockerfile}: COPY {src}: excluded by .dockerignore")
            installed_dirs.add(src)
    final = stages[-1]
    users = final.args("USER")
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append(f"{dockerfile}: the final stage must run as a non-root USER")
    cmds = final.args("CMD")
    if not cmds:
        problems.append(f"{dockerfile}: no CMD")
        return problems
    argv = command or exec_form(cmds[-1])
    if argv[:2] == ["python", "-m"] and len(argv) > 2:
        module = argv[2]
        found = module_file(module)
        if found is None:
            problems.append(f"{dockerfile}: python -m {module}: no such module in the tree")
        elif not any(found.is_relative_to(REPO / d) for d in installed_dirs):
            problems.append(f"{dockerfile}: python -m {module}: its package is not installed")
    return problems


# --- docker-compose.yml -----------------------------------------------------------------


def depends_on(service: dict[str, Any]) -> dict[str, str]:
    """Target -> condition, for both the list and the mapping form."""
    value = service.get("depends_on") or {}
    if isinstance(value, list):
        return {name: "service_started" for name in value}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in value.items()}


def networks_of(service: dict[str, Any]) -> set[str]:
    value = service.get("networks")
    if value is None:
        return {"default"}
    return set(value)


def environment(service: dict[str, Any]) -> dict[str, str | None]:
    value = service.get("environment") or {}
    if isinstance(value, list):
        pairs = [item.split("=", 1) for item in value]
        return {p[0]: (p[1] if len(p) > 1 else None) for p in pairs}
    return {k: (None if v is None else str(v)) for k, v in value.items()}


def mounts(service: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(type, source, target) for each volume entry, short or long syntax."""
    out = []
    for entry in service.get("volumes") or []:
        if isinstance(entry, dict):
            out.append((entry.get("type", "volume"), str(entry.get("source", "")), entry["target"]))
            continue
        parts = entry.split(":")
        if len(parts) == 1:
            out.append(("volume", "", parts[0]))  # anonymous volume
            continue
        source, target = parts[0], parts[1]
        is_named = not source.startswith((".", "/", "~", "$"))
        out.append(("volume" if is_named else "bind", source, target))
    return out


def _host_port(address: str) -> tuple[str, int]:
    parsed = urlsplit(address if "://" in address else f"grpc://{address}")
    assert parsed.hostname and parsed.port, address
    return parsed.hostname, parsed.port


def listen_port(service: dict[str, Any]) -> int | None:
    address = environment(service).get("GPUFLEET_LISTEN_ADDRESS")
    return _host_port(address)[1] if address else None


def has_healthcheck(name: str, service: dict[str, Any], base: Path) -> bool:
    if "healthcheck" in service:
        return not service["healthcheck"].get("disable", False)
    build = service.get("build")
    if isinstance(build, dict):
        dockerfile = base / build.get("context", ".") / build.get("dockerfile", "Dockerfile")
        return dockerfile.is_file() and bool(parse_dockerfile(dockerfile)[-1].args("HEALTHCHECK"))
    return False


def compose_problems(compose: Compose, base: Path = REPO) -> list[str]:
    """References between services, volumes, networks, build files and addresses."""
    problems: list[str] = []
    services: dict[str, Any] = compose.get("services", {})
    declared_volumes = set(compose.get("volumes") or {})
    declared_networks = set(compose.get("networks") or {}) | {"default"}
    for name, svc in services.items():
        for target, condition in depends_on(svc).items():
            if target not in services:
                problems.append(f"{name}: depends_on {target}: no such service")
            elif condition == "service_healthy" and not has_healthcheck(target, services[target], base):
                problems.append(f"{name}: waits for {target} healthy, but it has no healthcheck")
        for net in networks_of(svc):
            if net not in declared_networks:
                problems.append(f"{name}: network {net} is not declared")
        for kind, source, _target in mounts(svc):
            if kind == "volume" and source and source not in declared_volumes:
                problems.append(f"{name}: volume {source} is not declared")
            if kind == "bind" and source.startswith(".") and not (base / source).exists():
                problems.append(f"{name}: bind mount {source} does not exist")
        build = svc.get("build")
        if build is not None:
            spec = build if isinstance(build, dict) else {"context": build}
            context = base / spec.get("context", ".")
            dockerfile = context / spec.get("dockerfile", "Dockerfile")
            if not dockerfile.is_file():
                problems.append(f"{name}: build.dockerfile {dockerfile} does not exist")
        problems.extend(_address_problems(name, svc, services))
    return problems


# Addresses a service listens on, not ones it dials.
LISTEN_ADDRESSES = ("GPUFLEET_LISTEN_ADDRESS", "GPUFLEET_HEALTH_LISTEN_ADDRESS", "GPUFLEET_METRICS_ADDRESS")


def metrics_address(service: dict[str, Any]) -> tuple[str, int] | None:
    """(host, port) of the service's metrics listener, when it serves one."""
    address = environment(service).get("GPUFLEET_METRICS_ADDRESS")
    return _host_port(address) if address else None


def _address_problems(name: str, svc: dict[str, Any], services: dict[str, Any]) -> list[str]:
    """Every address a service dials names a service on a shared network, on its port."""
    problems = []
    for key, value in environment(svc).items():
        if not value or not key.startswith("GPUFLEET_"):
            continue
        if not (key.endswith("_ADDRESS") or key in ("GPUFLEET_OTLP_ENDPOINT", "GPUFLEET_DATABASE_URL")):
            continue
        if key in LISTEN_ADDRESSES:
            continue
        host, port = _host_port(value)
        target = services.get(host)
        if target is None:
            problems.append(f"{name}: {key} names {host}, which is no service")
            continue
        if not networks_of(svc) & networks_of(target):
            problems.append(f"{name}: {key}: {host} is on no network {name} is on")
        if listen_port(target) not in (None, port):
            problems.append(f"{name}: {key} dials {host}:{port}, but {host} listens on {listen_port(target)}")
    return problems


def credential_holders(compose: Compose) -> dict[str, list[str]]:
    """Service -> the cloud credential variables and mounts it is given."""
    holders: dict[str, list[str]] = {}
    for name, svc in compose.get("services", {}).items():
        found = [k for k in environment(svc) if CREDENTIAL_ENV.match(k)]
        found += [f"{s}:{t}" for _k, s, t in mounts(svc) if CREDENTIAL_MOUNT.search(f"{s}:{t}")]
        if found:
            holders[name] = found
    return holders


# --- the collector ----------------------------------------------------------------------


def collector_problems(config: dict[str, Any], compose: Compose) -> list[str]:
    """Pipelines use only defined components; exporters dial services it shares a network with."""
    problems: list[str] = []
    services = compose.get("services", {})
    collector = next(
        (n for n, s in services.items() if "opentelemetry-collector" in str(s.get("image", ""))), None
    )
    if collector is None:
        return ["no OpenTelemetry collector service in docker-compose.yml"]
    pipelines = config.get("service", {}).get("pipelines", {})
    if "traces" not in pipelines:
        problems.append("the collector has no traces pipeline")
    for pipeline, spec in pipelines.items():
        for section in ("receivers", "processors", "exporters"):
            for component in spec.get(section, []):
                if component not in (config.get(section) or {}):
                    problems.append(f"pipeline {pipeline}: {section[:-1]} {component} is not defined")
    for exporter, spec in (config.get("exporters") or {}).items():
        endpoint = (spec or {}).get("endpoint")
        if not endpoint:
            continue
        host, _port = _host_port(endpoint)
        if host in ("0.0.0.0", "localhost", "127.0.0.1"):
            continue  # a listening exporter (e.g. prometheus), not a destination
        if host not in services:
            problems.append(f"exporter {exporter}: {host} is no service in docker-compose.yml")
        elif not networks_of(services[collector]) & networks_of(services[host]):
            problems.append(f"exporter {exporter}: {host} shares no network with {collector}")
    return problems


# --- Prometheus and Grafana ------------------------------------------------------------------


def scrape_targets(config: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """Job name -> the (host, port) it scrapes (one static target a job)."""
    found = {}
    for job in config.get("scrape_configs") or []:
        for static in job.get("static_configs") or []:
            for target in static.get("targets") or []:
                found[job["job_name"]] = _host_port(target)
    return found


def prometheus_problems(config: dict[str, Any], compose: Compose, scraper: str = "prometheus") -> list[str]:
    """Each scrape target is a service that Prometheus shares a network with, at the port its
    metrics listener serves on, on every interface (127.0.0.1 in a container is its own)."""
    problems: list[str] = []
    services = compose.get("services", {})
    if scraper not in services:
        return [f"no {scraper} service in docker-compose.yml"]
    for job, (host, port) in scrape_targets(config).items():
        target = services.get(host)
        if target is None:
            problems.append(f"job {job}: {host} is no service")
            continue
        if not networks_of(services[scraper]) & networks_of(target):
            problems.append(f"job {job}: {host} shares no network with {scraper}")
        served = metrics_address(target)
        if served is None:
            problems.append(f"job {job}: {host} serves no metrics (GPUFLEET_METRICS_ADDRESS)")
        elif served[1] != port:
            problems.append(f"job {job} scrapes {host}:{port}, but its metrics listener is on {served[1]}")
        elif served[0] != "0.0.0.0":
            problems.append(f"job {job}: {host} serves metrics on {served[0]} only, out of {scraper}'s reach")
    return problems


def grafana_problems(datasources: dict[str, Any], providers: dict[str, Any], compose: Compose) -> list[str]:
    """Grafana's datasources dial services it shares a network with; each dashboard
    provider reads a folder mounted into it."""
    problems: list[str] = []
    services = compose.get("services", {})
    grafana = services.get("grafana")
    if grafana is None:
        return ["no grafana service in docker-compose.yml"]
    for source in datasources.get("datasources") or []:
        host, _port = _host_port(source["url"])
        if host not in services:
            problems.append(f"datasource {source['name']}: {host} is no service")
        elif not networks_of(grafana) & networks_of(services[host]):
            problems.append(f"datasource {source['name']}: {host} shares no network with grafana")
    # The dashboards come from the repository: a folder of a volume would be empty.
    targets = {target for kind, _source, target in mounts(grafana) if kind == "bind"}
    for provider in providers.get("providers") or []:
        path = provider["options"]["path"]
        if not any(
            path == t.removesuffix(":ro") or path.startswith(t.removesuffix(":ro") + "/") for t in targets
        ):
            problems.append(
                f"dashboard provider {provider['name']}: {path} is mounted into grafana from nowhere"
            )
    return problems
