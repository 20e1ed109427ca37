"""The deployment files (DESIGN.md §1, §11, §13), validated offline: the compose file against
the Compose Specification and for its references, each image's Dockerfile against the tree,
the collector's config against the compose file, and where the walls are (database,
credentials). Each kind of check is also shown to fail on a broken copy."""

from __future__ import annotations

import copy
import importlib
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.quality._deployfiles import (
    collector_problems,
    compose_problems,
    copy_sources,
    credential_holders,
    depends_on,
    dockerfile_problems,
    environment,
    exec_form,
    listen_port,
    load_compose,
    mounts,
    networks_of,
    parse_dockerfile,
)
from tests.quality._repo import REPO, SERVICES, run, tool
from tests.support import tls

STORE_SERVICES = {"scheduler", "reaper", "sweeper"}
DEFAULT_PORTS = {"scheduler": 50051, "reaper": 50052, "provisioner": 50053, "sweeper": 50054, "agent": 50060}
PROBE = "deploy/grpc_health_probe.py"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_compose()


# --- docker-compose.yml -----------------------------------------------------------------


def check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    return run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)])


def test_compose_file_follows_the_compose_specification() -> None:
    result = check_jsonschema(REPO / "docker-compose.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_rejects_a_broken_compose_file(tmp_path: Path) -> None:
    broken = (
        (REPO / "docker-compose.yml")
        .read_text()
        .replace("condition: service_completed_successfully", "condition: service_finished", 1)
    )
    (tmp_path / "docker-compose.yml").write_text(broken)
    result = check_jsonschema(tmp_path / "docker-compose.yml")
    assert result.returncode != 0
    assert "service_finished" in result.stdout + result.stderr


def test_every_reference_in_the_compose_file_resolves(compose: dict[str, Any]) -> None:
    assert compose_problems(compose) == []


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
            _set(["services", "scheduler", "depends_on", "provisoner"], {}),
            "scheduler: depends_on provisoner: no such service",
            id="depends-on-a-typo",
        ),
        pytest.param(
            _set(["services", "agent", "volumes"], ["agent-data:/var/lib/gpufleet/agent"]),
            "agent: volume agent-data is not declared",
            id="undeclared-volume",
        ),
        pytest.param(
            _set(["services", "reaper", "networks"], ["store", "controll"]),
            "reaper: network controll is not declared",
            id="undeclared-network",
        ),
        pytest.param(
            _set(["services", "sweeper", "build", "dockerfile"], "services/sweeper/Dockerfil"),
            "sweeper: build.dockerfile",
            id="missing-dockerfile",
        ),
        pytest.param(
            _set(["services", "reaper", "environment", "GPUFLEET_PROVISIONER_ADDRESS"], "provisioner:50051"),
            "reaper: GPUFLEET_PROVISIONER_ADDRESS dials provisioner:50051, but provisioner listens on 50053",
            id="wrong-port",
        ),
        pytest.param(
            _set(["services", "scheduler", "networks"], ["store"]),
            "agent: GPUFLEET_SCHEDULER_ADDRESS: scheduler is on no network agent is on",
            id="agent-cut-off-from-the-scheduler",
        ),
        pytest.param(
            _set(["services", "migrate", "depends_on"], {"otel-collector": {"condition": "service_healthy"}}),
            "migrate: waits for otel-collector healthy, but it has no healthcheck",
            id="healthy-without-healthcheck",
        ),
    ],
)
def test_a_broken_reference_is_reported(
    compose: dict[str, Any], mutate: Callable[[dict[str, Any]], None], problem: str
) -> None:
    broken = copy.deepcopy(compose)
    mutate(broken)
    problems = compose_problems(broken)
    assert any(problem in p for p in problems), problems


def test_only_the_services_with_database_access_reach_postgres(compose: dict[str, Any]) -> None:
    services = compose["services"]
    postgres_nets = networks_of(services["postgres"])
    reach = {n for n, s in services.items() if n != "postgres" and networks_of(s) & postgres_nets}
    with_url = {n for n, s in services.items() if "GPUFLEET_DATABASE_URL" in environment(s)}
    assert reach == with_url == STORE_SERVICES | {"migrate"}


def test_postgres_keeps_its_data_in_a_named_volume_and_reports_health(compose: dict[str, Any]) -> None:
    postgres = compose["services"]["postgres"]
    assert ("volume", "postgres-data", "/var/lib/postgresql/data") in mounts(postgres)
    assert "pg_isready" in postgres["healthcheck"]["test"]


def test_migrations_run_once_after_postgres_and_before_every_store_service(compose: dict[str, Any]) -> None:
    services = compose["services"]
    migrate = services["migrate"]
    assert migrate["command"] == ["python", "-m", "gpufleet.common.db.migrate"]
    assert depends_on(migrate) == {"postgres": "service_healthy"}
    assert migrate.get("restart") == "no"
    for name in STORE_SERVICES:
        assert depends_on(services[name]).get("migrate") == "service_completed_successfully", name


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_gets_the_environment_it_reads(compose: dict[str, Any], name: str) -> None:
    env = environment(compose["services"][name])
    assert env["GPUFLEET_LISTEN_ADDRESS"] == f"0.0.0.0:{DEFAULT_PORTS[name]}"
    assert env["GPUFLEET_DEPLOYMENT_ID"]
    assert env["GPUFLEET_OTLP_ENDPOINT"] == "https://otel-collector:4317"
    assert env.get("GPUFLEET_OTLP_TRUST", "deployment") == "deployment"
    assert ("GPUFLEET_DATABASE_URL" in env) is (name in STORE_SERVICES)
    if name in STORE_SERVICES:
        assert env["GPUFLEET_PROVISIONER_ADDRESS"] == "provisioner:50053"
    if name == "agent":
        assert env["GPUFLEET_MACHINE_ID"]
        assert env["GPUFLEET_SCHEDULER_ADDRESS"] == "scheduler:50051"


@pytest.mark.parametrize("name", SERVICES)
def test_every_gpufleet_variable_is_a_setting_the_service_reads(compose: dict[str, Any], name: str) -> None:
    """Settings ignore unknown variables, so a misspelt one would silently do nothing."""
    fields = set(importlib.import_module(f"gpufleet.{name}.settings").Settings.model_fields)
    env = environment(compose["services"][name])
    unread = [
        k for k in env if k.startswith("GPUFLEET_") and k.removeprefix("GPUFLEET_").lower() not in fields
    ]
    assert unread == []


def test_cloud_credentials_go_to_the_provisioner_only(compose: dict[str, Any]) -> None:
    holders = credential_holders(compose)
    assert set(holders) == {"provisioner"}
    assert any(":" in item for item in holders["provisioner"]), "no credential mount"


def test_a_credential_given_to_another_service_is_caught(compose: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["sweeper"]["volumes"] = ["~/.config/gcloud:/home/gpufleet/.config/gcloud:ro"]
    broken["services"]["agent"]["environment"]["AWS_ACCESS_KEY_ID"] = None
    assert set(credential_holders(broken)) == {"provisioner", "sweeper", "agent"}


# --- Dockerfiles ------------------------------------------------------------------------


def test_every_image_in_the_compose_file_builds_from_the_tree(compose: dict[str, Any]) -> None:
    built = {n: s for n, s in compose["services"].items() if "build" in s}
    assert set(built) == set(SERVICES) | {"migrate", "certs", "metrics-cert"}
    for name, svc in built.items():
        dockerfile = REPO / svc["build"].get("context", ".") / svc["build"]["dockerfile"]
        assert svc["build"].get("context", ".") == "."
        assert dockerfile_problems(dockerfile, svc.get("command")) == [], name


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_image_installs_only_its_own_packages(name: str) -> None:
    dockerfile = REPO / "services" / name / "Dockerfile"
    stages = parse_dockerfile(dockerfile)
    assert {s.base for s in stages} == {"python:3.11-slim"}
    build, final = stages[0], stages[-1]
    assert set(copy_sources(build)) == {"protos", "libs/common", f"services/{name}"}
    (install,) = [a for a in build.args("RUN") if "pip install" in a]
    common = '"/src/libs/common[store]"' if name in STORE_SERVICES else "/src/libs/common"
    assert install.endswith(f"pip install /src/protos {common} /src/services/{name}")
    assert copy_sources(final) == [PROBE]
    assert exec_form(final.args("CMD")[-1]) == ["python", "-m", f"gpufleet.{name}"]
    healthcheck = final.args("HEALTHCHECK")[-1]
    assert exec_form(healthcheck.split("CMD", 1)[1].strip()) == [
        "python",
        "/opt/gpufleet/grpc_health_probe.py",
    ]
    port = DEFAULT_PORTS[name]
    assert f"GPUFLEET_LISTEN_ADDRESS=0.0.0.0:{port}" in " ".join(final.args("ENV"))
    assert final.args("EXPOSE") == [str(port)]


def test_the_migrations_image_installs_the_store_and_nothing_else() -> None:
    stages = parse_dockerfile(REPO / "deploy" / "migrate.Dockerfile")
    assert set(copy_sources(stages[0])) == {"protos", "libs/common"}
    assert copy_sources(stages[-1]) == []
    assert exec_form(stages[-1].args("CMD")[-1]) == ["python", "-m", "gpufleet.common.db.migrate"]


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (lambda t: t.replace("COPY protos ", "COPY proto "), "COPY proto: no such path"),
        (lambda t: t.replace("USER 10001:10001", "USER root"), "non-root USER"),
        (
            lambda t: re.sub(
                r'CMD \["python", "-m", "gpufleet\.scheduler"\]',
                'CMD ["python", "-m", "gpufleet.schedular"]',
                t,
            ),
            "python -m gpufleet.schedular: no such module",
        ),
        (
            lambda t: t.replace("COPY services/scheduler /src/services/scheduler\n", "").replace(
                " /src/services/scheduler", ""
            ),
            "python -m gpufleet.scheduler: its package is not installed",
        ),
        (
            lambda t: t.replace("COPY deploy/grpc_health_probe.py", "COPY .git/HEAD"),
            "COPY .git/HEAD: excluded by .dockerignore",
        ),
    ],
    ids=["missing-path", "root-user", "unknown-module", "module-not-installed", "ignored-path"],
)
def test_a_broken_dockerfile_is_reported(tmp_path: Path, edit: Callable[[str], str], problem: str) -> None:
    original = (REPO / "services" / "scheduler" / "Dockerfile").read_text()
    broken = edit(original)
    assert broken != original
    (tmp_path / "Dockerfile").write_text(broken)
    problems = dockerfile_problems(tmp_path / "Dockerfile")
    assert any(problem in p for p in problems), problems


def test_the_build_context_keeps_out_the_virtualenv_and_the_tests() -> None:
    patterns = (REPO / ".dockerignore").read_text().split()
    for required in (".git", ".venv", "tests", "**/__pycache__", "**/*.egg-info"):
        assert required in patterns


# --- the collector and the tracing UI ---------------------------------------------------


@pytest.fixture(scope="module")
def collector_config() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "deploy" / "otel-collector.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_the_collector_config_is_consistent_with_the_compose_file(
    compose: dict[str, Any], collector_config: dict[str, Any]
) -> None:
    assert collector_problems(collector_config, compose) == []
    collector = compose["services"]["otel-collector"]
    (config_arg,) = [a for a in collector["command"] if a.startswith("--config=")]
    assert ("bind", "./deploy/otel-collector.yaml", config_arg.removeprefix("--config=")) in [
        (k, s, t.removesuffix(":ro")) for k, s, t in mounts(collector)
    ]
    # Services export to the collector's OTLP gRPC receiver; traces leave for Jaeger.
    grpc_receiver = collector_config["receivers"]["otlp"]["protocols"]["grpc"]
    assert grpc_receiver["endpoint"].endswith(":4317")
    # Mutual TLS with the collector's own folder of the tls volume, which the certs step makes.
    assert list(collector_config["receivers"]["otlp"]["protocols"]) == ["grpc"]
    folder = "/etc/otelcol-contrib/tls"
    assert grpc_receiver["tls"] == {
        "cert_file": f"{folder}/tls.crt",
        "key_file": f"{folder}/tls.key",
        "client_ca_file": f"{folder}/ca.crt",
    }
    tls_mounts = [v for v in collector["volumes"] if isinstance(v, dict) and v.get("source") == "tls"]
    assert [(m["target"], m["volume"]["subpath"], m["read_only"]) for m in tls_mounts] == [
        (folder, "collector", True)
    ]
    (parts,) = [a for a in compose["services"]["certs"]["command"] if a.startswith("--parts=")]
    assert "collector" in parts.removeprefix("--parts=").split(",")
    assert collector["depends_on"]["certs"]["condition"] == "service_completed_successfully"
    assert collector_config["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"
    assert compose["services"]["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert listen_port(compose["services"]["jaeger"]) is None


def test_a_collector_exporting_to_an_unknown_service_is_reported(
    compose: dict[str, Any], collector_config: dict[str, Any]
) -> None:
    broken = copy.deepcopy(collector_config)
    broken["exporters"]["otlp/jaeger"]["endpoint"] = "tempo:4317"
    broken["service"]["pipelines"]["traces"]["exporters"].append("zipkin")
    problems = collector_problems(broken, compose)
    assert "exporter otlp/jaeger: tempo is no service in docker-compose.yml" in problems
    assert "pipeline traces: exporter zipkin is not defined" in problems


# --- the HEALTHCHECK probe, against a real gRPC server ----------------------------------


@pytest.fixture
def health_server() -> Iterator[Any]:
    from gpufleet.common.grpcserver import create_server

    health_port = free_port()
    server = create_server(
        "127.0.0.1:0",
        [],
        transport=tls.transport("scheduler"),
        health_address=f"127.0.0.1:{health_port}",
    )
    assert server.health_port == health_port
    yield server
    server.stop(0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def probe(health_address: str) -> subprocess.CompletedProcess[str]:
    return run(
        [sys.executable, str(REPO / PROBE)],
        env={"GPUFLEET_LISTEN_ADDRESS": "0.0.0.0:50051", "GPUFLEET_HEALTH_LISTEN_ADDRESS": health_address},
        timeout=30,
    )


def test_the_health_probe_passes_a_serving_server_listening_on_all_interfaces(health_server: Any) -> None:
    result = probe(f"0.0.0.0:{health_server.health_port}")
    assert result.returncode == 0, result.stderr
    assert "SERVING" in result.stdout


def test_the_health_probe_fails_a_server_that_stopped_serving(health_server: Any) -> None:
    health_server.set_serving(False)
    result = probe(f"0.0.0.0:{health_server.health_port}")
    assert result.returncode == 1
    assert "NOT_SERVING" in result.stdout


def test_the_health_probe_fails_when_nothing_listens(health_server: Any) -> None:
    port = health_server.health_port
    health_server.stop(0)
    result = probe(f"0.0.0.0:{port}")
    assert result.returncode == 1
    assert "UNAVAILABLE" in result.stderr


def test_the_health_port_answers_the_health_check_and_nothing_else(health_server: Any) -> None:
    """The plaintext port is for a probe: every other method there is unimplemented, and
    the main port does not answer a caller without a certificate at all."""
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{health_server.health_port}") as channel:
        with pytest.raises(grpc.RpcError) as info:
            list(
                reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
                )
            )
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
    with grpc.insecure_channel(f"127.0.0.1:{health_server.port}") as channel:
        with pytest.raises(grpc.RpcError) as info:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE  # type: ignore[attr-defined]


def test_the_health_probe_refuses_an_address_without_a_fixed_port() -> None:
    result = probe("0.0.0.0:0")
    assert result.returncode == 2
    assert "names no fixed port" in result.stderr


# --- trust: certificates in the compose file ----------------------------------------------


@pytest.mark.parametrize("name", [*SERVICES, "agent"])
def test_each_service_serves_tls_with_its_own_folder_of_the_tls_volume(
    compose: dict[str, Any], name: str
) -> None:
    svc = compose["services"][name]
    env = environment(svc)
    assert env["GPUFLEET_TLS_CA_FILE"].startswith("/etc/gpufleet/tls/")
    assert env["GPUFLEET_TLS_CERT_FILE"].startswith("/etc/gpufleet/tls/")
    assert env["GPUFLEET_TLS_KEY_FILE"].startswith("/etc/gpufleet/tls/")
    assert "GPUFLEET_INSECURE" not in env
    tls_mounts = [v for v in svc["volumes"] if isinstance(v, dict) and v.get("source") == "tls"]
    assert len(tls_mounts) == 1 and tls_mounts[0]["read_only"] is True
    part = tls_mounts[0]["volume"]["subpath"]
    assert part == name or (name == "agent" and part.startswith("machine-"))
    assert svc["depends_on"]["certs"]["condition"] == "service_completed_successfully"


def test_the_ca_keys_are_mounted_nowhere_and_the_machine_ca_only_in_the_provisioner(
    compose: dict[str, Any],
) -> None:
    for name, svc in compose["services"].items():
        for entry in svc.get("volumes") or []:
            if isinstance(entry, dict) and entry.get("source") == "tls":
                assert entry["volume"]["subpath"] not in ("", "ca"), name
            elif isinstance(entry, str) and entry.startswith("tls:"):
                assert name in ("certs", "metrics-cert"), f"{name} mounts the whole tls volume"
        env = environment(svc)
        if "GPUFLEET_TLS_MACHINE_CA_KEY_FILE" in env:
            assert name == "provisioner"
