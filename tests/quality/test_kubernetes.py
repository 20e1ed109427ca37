"""The Kubernetes manifests (deploy/kubernetes, docs/kubernetes.md), rendered by
`kubectl kustomize` as an operator would and validated offline: against the schemas of
Kubernetes itself (kubernetes-validate, strict: an unknown field is an error), against the
services' own typed settings (every variable one the service reads, every port the one it
listens on or dials), against the images (every command exists in its image), and for the
walls: non-root read-only pods, cloud credentials in the provisioner alone, each part's own
certificate, the migrations before the services, a standby for every leader. Each kind of
check is also shown to fail on a broken copy. Nothing here reaches a cluster."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from tests.quality._kubernetes import (
    BUCKET,
    BUCKET_VALUES,
    COMPONENTS,
    KUSTOMIZE,
    OVERLAYS,
    PARTS,
    Doc,
    command_problems,
    config_map,
    container_env,
    environment_problems,
    of_kind,
    parts,
    render,
    render_with_components,
    selects,
    workload_of,
    workloads,
)
from tests.quality._kubernetes_checks import (
    NEWEST,
    OLDEST,
    main_reader,
    part_settings,
    port_problems,
    schema_problems,
)
from tests.quality._repo import REPO


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {overlay: render(KUSTOMIZE / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="module")
def with_components(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    return render_with_components(tmp_path_factory.mktemp("overlay"), "production", COMPONENTS)


# --- rendering and schemas ------------------------------------------------------------------


def test_the_schemas_are_carried_offline() -> None:
    # kubernetes-validate ships the schemas in its wheel: nothing is fetched.
    assert NEWEST >= "1.37"
    assert f"{OLDEST.rsplit('.', 1)[0]}" in {
        v.rsplit(".", 1)[0] for v in kubernetes_validate.utils.all_versions()
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", [OLDEST, NEWEST])
def test_each_overlay_renders_and_validates(
    rendered: dict[str, list[Doc]], overlay: str, version: str
) -> None:
    docs = rendered[overlay]
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "Namespace"} <= kinds
    assert schema_problems(docs, version) == []


def test_the_base_renders_and_validates() -> None:
    assert schema_problems(render(KUSTOMIZE / "base"), NEWEST) == []


def test_the_optional_components_render_and_validate(with_components: list[Doc]) -> None:
    assert schema_problems(with_components, NEWEST) == []
    monitors = of_kind(with_components, "PodMonitor")
    assert set(monitors) == {f"gpufleet-{part}" for part in PARTS}
    deployment = of_kind(with_components, "ConfigMap")
    deployment_id = next(
        cm["data"]["GPUFLEET_DEPLOYMENT_ID"]
        for n, cm in deployment.items()
        if n.startswith("gpufleet-common")
    )
    for part in PARTS:
        monitor = monitors[f"gpufleet-{part}"]["spec"]
        workload = workload_of(with_components, part)
        assert selects(monitor["selector"], workload.labels)
        (endpoint,) = monitor["podMetricsEndpoints"]
        assert endpoint["port"] in {p["name"] for p in workload.main()["ports"]}
        assert endpoint["scheme"] == "https"
        # The certificate name the service proves: <part>.gpufleet.<deployment id>.
        assert endpoint["tlsConfig"]["serverName"] == f"{part}.gpufleet.{deployment_id}"


def test_the_checkpoint_bucket_component_renders_and_validates(tmp_path: Path) -> None:
    docs = render_with_components(tmp_path, "production", (BUCKET,), BUCKET_VALUES)
    assert schema_problems(docs, OLDEST) == schema_problems(docs, NEWEST) == []


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        pytest.param(
            lambda d: d["spec"]["template"]["spec"]["containers"][0].update(
                readinessProbe={"grpc": {"port": "health"}}
            ),
            "readinessProbe/grpc/port",
            id="named-port-in-a-grpc-probe",
        ),
        pytest.param(
            lambda d: d["spec"]["template"]["spec"]["containers"][0]["securityContext"].update(
                readOnlyRootFs=True
            ),
            "readOnlyRootFs",
            id="unknown-field",
        ),
        pytest.param(lambda d: d["spec"].update(replicas="two"), "replicas", id="wrong-type"),
    ],
)
def test_the_schema_check_rejects_a_broken_copy(
    rendered: dict[str, list[Doc]], mutate: Callable[[Doc], None], problem: str
) -> None:
    docs = copy.deepcopy(rendered["production"])
    mutate(workload_of(docs, "scheduler").doc)
    problems = schema_problems(docs, NEWEST)
    assert len(problems) == 1 and problems[0].startswith("Deployment/gpufleet-scheduler"), problems
    assert problem in problems[0]


# --- the services' own settings, ports and commands --------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_variable_is_a_setting_the_service_reads(rendered: dict[str, list[Doc]], overlay: str) -> None:
    docs = rendered[overlay]
    assert [p for w in workloads(docs) for p in environment_problems(docs, w)] == []


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        pytest.param(
            lambda docs: container_env(docs, "reaper").append({"name": "GPUFLEET_TICK_S", "value": "5"}),
            "Deployment/gpufleet-reaper/reaper: GPUFLEET_TICK_S is not a setting gpufleet.reaper reads",
            id="another-service-s-setting",
        ),
        pytest.param(
            lambda docs: container_env(docs, "scheduler").append(
                {"name": "GPUFLEET_CHECKPOINTS_DIR", "value": "/x"}
            ),
            "GPUFLEET_CHECKPOINTS_DIR is not a setting gpufleet.scheduler reads",
            id="a-typo",
        ),
        pytest.param(
            lambda docs: (
                workload_of(docs, "sweeper")
                .pod["initContainers"][0]["env"]
                .append({"name": "GPUFLEET_LOG_LEVEL", "value": "DEBUG"})
            ),
            "Deployment/gpufleet-sweeper/migrate: GPUFLEET_LOG_LEVEL is not a setting "
            "gpufleet.common.db.migrate reads",
            id="migrate-reads-only-the-url",
        ),
        pytest.param(
            lambda docs: config_map(docs, "gpufleet-scheduler")["data"].update(GPUFLEET_FILM_SHARE="2"),
            "gpufleet.scheduler refuses its settings",
            id="a-value-out-of-range",
        ),
    ],
)
def test_the_settings_check_rejects_a_broken_copy(
    rendered: dict[str, list[Doc]], mutate: Callable[[list[Doc]], None], problem: str
) -> None:
    docs = copy.deepcopy(rendered["production"])
    mutate(docs)
    problems = [p for w in workloads(docs) for p in environment_problems(docs, w)]
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_port_is_the_one_the_service_listens_on_or_dials(
    rendered: dict[str, list[Doc]], overlay: str
) -> None:
    docs = rendered[overlay]
    problems = []
    for workload in parts(docs):
        reader = main_reader(docs, workload)
        assert reader is not None and reader.settings is not None
        problems += port_problems(docs, workload, reader.settings)
    assert problems == []


@pytest.mark.parametrize(
    ("part", "mutate", "problem"),
    [
        pytest.param(
            "scheduler",
            lambda d: container_env(d, "scheduler").__setitem__(
                2, {"name": "GPUFLEET_METRICS_ADDRESS", "value": "0.0.0.0:9999"}
            ),
            "metrics_address listens on 9999, the container's metrics port is 9451",
            id="metrics-port",
        ),
        pytest.param(
            "reaper",
            lambda d: container_env(d, "reaper").__setitem__(
                1, {"name": "GPUFLEET_HEALTH_LISTEN_ADDRESS", "value": "127.0.0.1:8081"}
            ),
            "health_listen_address=127.0.0.1:8081 is out of the kubelet's and Services' reach",
            id="health-on-loopback",
        ),
        pytest.param(
            "sweeper",
            lambda d: workload_of(d, "sweeper").main()["livenessProbe"].update(grpc={"port": 50054}),
            "livenessProbe asks port 50054, health is on 8081",
            id="probe-on-the-tls-port",
        ),
        pytest.param(
            "sweeper",
            lambda d: config_map(d, "gpufleet-store")["data"].update(
                GPUFLEET_PROVISIONER_ADDRESS="gpufleet-provisioner:50051"
            ),
            "no Service port 50051 leads to the provisioner's gRPC port",
            id="provisioner-address-port",
        ),
        pytest.param(
            "reaper",
            lambda d: config_map(d, "gpufleet-store")["data"].update(
                GPUFLEET_PROVISIONER_ADDRESS="gpufleet-scheduler:50053"
            ),
            "Service gpufleet-scheduler does not select the provisioner",
            id="provisioner-address-host",
        ),
        pytest.param(
            "provisioner",
            lambda d: of_kind(d, "Service")["gpufleet-provisioner"]["spec"]["ports"][0].update(
                targetPort="gprc"
            ),
            "Service/gpufleet-provisioner: port 50053 targets gprc, "
            "which Deployment/gpufleet-provisioner does not serve",
            id="service-target-typo",
        ),
    ],
)
def test_the_port_check_rejects_a_broken_copy(
    rendered: dict[str, list[Doc]], part: str, mutate: Callable[[list[Doc]], None], problem: str
) -> None:
    docs = copy.deepcopy(rendered["production"])
    mutate(docs)
    problems = port_problems(docs, workload_of(docs, part), part_settings(docs, part))
    assert any(problem in p for p in problems), problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_command_exists_in_its_image(rendered: dict[str, list[Doc]], overlay: str) -> None:
    docs = rendered[overlay]
    assert [p for w in workloads(docs) for p in command_problems(w)] == []
    # Each part runs its own image: the provisioner's alone has the cloud SDKs.
    for part in PARTS:
        assert workload_of(docs, part).main()["image"].rsplit(":", 1)[0].endswith(f"gpufleet/{part}")


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        pytest.param(
            lambda w: w.main().update(command=["python", "-m", "gpufleet.scheduler.server"]),
            "python -m gpufleet.scheduler.server: no such module in the tree",
            id="no-such-module",
        ),
        pytest.param(
            lambda w: w.main().update(command=["python", "-m", "gpufleet.reaper"]),
            "python -m gpufleet.reaper: its package is not installed",
            id="another-image-s-module",
        ),
        pytest.param(
            lambda w: w.main().update(command=["gpufleet", "up"]),
            "gpufleet is no command the image",
            id="a-console-script-the-image-lacks",
        ),
    ],
)
def test_the_command_check_rejects_a_broken_copy(
    rendered: dict[str, list[Doc]], mutate: Callable[[Any], None], problem: str
) -> None:
    docs = copy.deepcopy(rendered["production"])
    workload = workload_of(docs, "scheduler")
    mutate(workload)
    problems = command_problems(workload)
    assert any(problem in p for p in problems), problems


def test_the_migrate_command_needs_the_store_extra(rendered: dict[str, list[Doc]]) -> None:
    docs = copy.deepcopy(rendered["production"])
    provisioner = workload_of(docs, "provisioner")
    provisioner.pod["initContainers"] = [
        {
            "name": "migrate",
            "image": provisioner.main()["image"],
            "command": ["python", "-m", "gpufleet.common.db.migrate"],
        }
    ]
    assert any(
        "needs gpufleet-common[store], which the image lacks" in p for p in command_problems(provisioner)
    )


def test_the_install_command_in_the_guide_is_the_one_that_renders() -> None:
    guide = (REPO / "docs" / "kubernetes.md").read_text()
    for overlay in OVERLAYS:
        assert f"kubectl apply -k deploy/kubernetes/overlays/{overlay}" in guide
        assert (KUSTOMIZE / "overlays" / overlay / "kustomization.yaml").is_file()
    assert (KUSTOMIZE / "components" / "prometheus-operator" / "kustomization.yaml").is_file()
