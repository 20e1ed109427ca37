"""The walls of the Kubernetes manifests (deploy/kubernetes), rendered by `kubectl kustomize`:
every pod unprivileged and bounded, cloud credentials in the provisioner alone, each part's
own certificate from its own Secret, the migrations before each part with database access, a
standby and a disruption budget for every leader, a checkpoint folder every scheduler shares.
Each check is also shown to fail on a broken copy."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.quality._kubernetes import (
    BUCKET,
    BUCKET_VALUES,
    CLOUD_SECRET,
    KUSTOMIZE,
    OVERLAYS,
    Doc,
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
    availability_problems,
    checkpoint_problems,
    credential_problems,
    migration_problems,
    part_settings,
    secrets_referenced,
    security_problems,
    tls_problems,
)
from tests.quality._repo import REPO


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {overlay: render(KUSTOMIZE / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_runs_unprivileged_and_bounded(rendered: dict[str, list[Doc]], overlay: str) -> None:
    assert [p for w in workloads(rendered[overlay]) for p in security_problems(w)] == []


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        pytest.param(lambda w: w.pod["securityContext"].update(runAsUser=0), "may run as root", id="root"),
        pytest.param(
            lambda w: w.main()["securityContext"].pop("readOnlyRootFilesystem"),
            "the root file system is writable",
            id="writable-root",
        ),
        pytest.param(
            lambda w: w.main()["securityContext"].update(allowPrivilegeEscalation=True),
            "allowPrivilegeEscalation is not false",
            id="escalation",
        ),
        pytest.param(
            lambda w: w.main()["securityContext"]["capabilities"].update(add=["NET_ADMIN"]),
            "capabilities not all dropped",
            id="a-capability",
        ),
        pytest.param(lambda w: w.pod["securityContext"].pop("seccompProfile"), "seccomp", id="no-seccomp"),
        pytest.param(
            lambda w: w.main()["resources"].pop("limits"), "no cpu request and limit", id="no-limits"
        ),
        pytest.param(
            lambda w: w.pod.pop("automountServiceAccountToken"), "service-account token", id="token"
        ),
    ],
)
def test_the_security_check_rejects_a_broken_copy(
    rendered: dict[str, list[Doc]], mutate: Callable[[Any], None], problem: str
) -> None:
    docs = copy.deepcopy(rendered["production"])
    workload = workload_of(docs, "reaper")
    mutate(workload)
    assert any(problem in p for p in security_problems(workload)), security_problems(workload)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_provisioner_holds_cloud_credentials(rendered: dict[str, list[Doc]], overlay: str) -> None:
    assert credential_problems(rendered[overlay]) == []


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        pytest.param(
            lambda docs: (
                workload_of(docs, "reaper")
                .pod["volumes"]
                .append({"name": "cloud", "secret": {"secretName": CLOUD_SECRET}})
            ),
            f"Deployment/gpufleet-reaper references the cloud credentials Secret {CLOUD_SECRET}",
            id="a-volume",
        ),
        pytest.param(
            lambda docs: container_env(docs, "sweeper").append(
                {"name": "X", "valueFrom": {"secretKeyRef": {"name": CLOUD_SECRET, "key": "aws-credentials"}}}
            ),
            f"Deployment/gpufleet-sweeper references the cloud credentials Secret {CLOUD_SECRET}",
            id="a-variable-from-it",
        ),
        pytest.param(
            lambda docs: of_kind(docs, "ServiceAccount")["gpufleet-scheduler"]["metadata"].update(
                annotations={"iam.gke.io/gcp-service-account": "x@p.iam.gserviceaccount.com"}
            ),
            "Deployment/gpufleet-scheduler runs as ServiceAccount gpufleet-scheduler, "
            "which may carry a cloud identity",
            id="workload-identity",
        ),
        pytest.param(
            lambda docs: workload_of(docs, "reaper").pod.update(serviceAccountName="gpufleet-provisioner"),
            "Deployment/gpufleet-reaper runs as ServiceAccount gpufleet-provisioner",
            id="the-provisioner-s-account",
        ),
        pytest.param(
            lambda docs: container_env(docs, "scheduler").append(
                {"name": "AWS_ACCESS_KEY_ID", "value": "AKIA"}
            ),
            "cloud credential variable AWS_ACCESS_KEY_ID",
            id="aws-keys",
        ),
    ],
)
def test_the_credentials_check_rejects_a_broken_copy(
    rendered: dict[str, list[Doc]], mutate: Callable[[list[Doc]], None], problem: str
) -> None:
    docs = copy.deepcopy(rendered["production"])
    mutate(docs)
    assert any(problem in p for p in credential_problems(docs)), credential_problems(docs)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_part_reads_its_own_certificate_from_its_own_secret(
    rendered: dict[str, list[Doc]], overlay: str
) -> None:
    docs = rendered[overlay]
    problems = []
    for workload in parts(docs):
        problems += tls_problems(docs, workload, part_settings(docs, workload.role))
    assert problems == []


@pytest.mark.parametrize(
    ("part", "mutate", "problem"),
    [
        pytest.param(
            "sweeper",
            lambda w: w.pod["volumes"][0]["secret"].update(secretName="gpufleet-scheduler-tls"),
            "Deployment/gpufleet-sweeper mounts gpufleet-scheduler-tls, another part's",
            id="another-part-s-secret",
        ),
        pytest.param(
            "scheduler",
            lambda w: w.main()["volumeMounts"][0].update(subPath="tls.crt"),
            "mounted by subPath",
            id="sub-path",
        ),
        pytest.param(
            "provisioner",
            lambda w: w.pod["volumes"][1]["secret"]["items"].pop(),
            "tls_machine_ca_key_file=/etc/gpufleet/machine-ca/tls.key: the Secret's volume has no tls.key",
            id="machine-ca-key-missing",
        ),
    ],
)
def test_the_certificate_check_rejects_a_broken_copy(
    rendered: dict[str, list[Doc]], part: str, mutate: Callable[[Any], None], problem: str
) -> None:
    docs = copy.deepcopy(rendered["production"])
    workload = workload_of(docs, part)
    mutate(workload)
    problems = tls_problems(docs, workload, part_settings(docs, part))
    assert any(problem in p for p in problems), problems


def test_the_secrets_the_base_names_are_the_documented_ones(rendered: dict[str, list[Doc]]) -> None:
    # Either certificate path (cert-manager, or `gpufleet certs issue` into Secrets) fills
    # these names; the guide lists each.
    named = {s for w in workloads(rendered["production"]) for s in secrets_referenced(w)}
    assert named == {
        "gpufleet-database",
        "gpufleet-scheduler-tls",
        "gpufleet-reaper-tls",
        "gpufleet-sweeper-tls",
        "gpufleet-provisioner-tls",
        "gpufleet-machine-ca",
        CLOUD_SECRET,
    }
    guide = (REPO / "docs" / "kubernetes.md").read_text()
    assert [name for name in sorted(named) if f"`{name}`" not in guide] == []


# --- order and availability -----------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_migrations_run_before_each_part_with_database_access(
    rendered: dict[str, list[Doc]], overlay: str
) -> None:
    docs = rendered[overlay]
    problems = []
    for workload in parts(docs):
        problems += migration_problems(docs, workload, part_settings(docs, workload.role))
    assert problems == []
    migrating = {w.role for w in parts(docs) if w.pod.get("initContainers")}
    assert migrating == {"scheduler", "reaper", "sweeper"}


def test_the_migration_check_rejects_a_broken_copy(rendered: dict[str, list[Doc]]) -> None:
    docs = copy.deepcopy(rendered["production"])
    scheduler = workload_of(docs, "scheduler")
    scheduler.pod["initContainers"][0]["image"] = "registry.example.com/gpufleet/scheduler:0.0.9"
    assert migration_problems(docs, scheduler, part_settings(docs, "scheduler")) == [
        "Deployment/gpufleet-scheduler: migrates with registry.example.com/gpufleet/scheduler:0.0.9, "
        "runs registry.example.com/gpufleet/scheduler:0.1.0"
    ]
    scheduler.pod.pop("initContainers")
    assert migration_problems(docs, scheduler, part_settings(docs, "scheduler")) == [
        "Deployment/gpufleet-scheduler: nothing migrates the database before it starts"
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_leader_has_a_standby_and_a_disruption_budget(
    rendered: dict[str, list[Doc]], overlay: str
) -> None:
    docs = rendered[overlay]
    assert availability_problems(docs) == []
    scheduler = workload_of(docs, "scheduler")
    # The API on every replica behind one in-cluster Service.
    in_cluster = [
        s
        for s in of_kind(docs, "Service").values()
        if s["spec"].get("type", "ClusterIP") == "ClusterIP"
        and selects(s["spec"]["selector"], scheduler.labels)
    ]
    assert [s["metadata"]["name"] for s in in_cluster] == ["gpufleet-scheduler"]
    assert (
        checkpoint_problems(docs, scheduler, part_settings(docs, "scheduler"), one_node=overlay == "dev")
        == []
    )


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        pytest.param(
            lambda docs: workload_of(docs, "reaper").doc["spec"].update(replicas=1),
            "Deployment/gpufleet-reaper: 1 replica(s), at least 2",
            id="no-standby",
        ),
        pytest.param(
            lambda docs: of_kind(docs, "PodDisruptionBudget")["gpufleet-sweeper"]["spec"].update(
                minAvailable=2
            ),
            "Deployment/gpufleet-sweeper: minAvailable 2 of 2: no drain",
            id="budget-blocks-drains",
        ),
        pytest.param(
            lambda docs: docs.remove(of_kind(docs, "PodDisruptionBudget")["gpufleet-scheduler"]),
            "Deployment/gpufleet-scheduler: 0 PodDisruptionBudgets select it",
            id="no-budget",
        ),
    ],
)
def test_the_availability_check_rejects_a_broken_copy(
    rendered: dict[str, list[Doc]], mutate: Callable[[list[Doc]], None], problem: str
) -> None:
    docs = copy.deepcopy(rendered["production"])
    mutate(docs)
    assert problem in availability_problems(docs)


def test_a_checkpoint_claim_one_node_only_is_refused_in_production(rendered: dict[str, list[Doc]]) -> None:
    docs = copy.deepcopy(rendered["production"])
    of_kind(docs, "PersistentVolumeClaim")["gpufleet-checkpoints"]["spec"]["accessModes"] = ["ReadWriteOnce"]
    scheduler = workload_of(docs, "scheduler")
    assert checkpoint_problems(docs, scheduler, part_settings(docs, "scheduler")) == [
        "Deployment/gpufleet-scheduler: claim gpufleet-checkpoints is ['ReadWriteOnce']: "
        "replicas on other nodes cannot mount it"
    ]


def test_checkpoints_in_a_bucket_need_no_claim(tmp_path: Path) -> None:
    docs = render_with_components(tmp_path, "production", (BUCKET,), BUCKET_VALUES)
    assert "gpufleet-checkpoints" not in of_kind(docs, "PersistentVolumeClaim")
    scheduler = workload_of(docs, "scheduler")
    assert "checkpoints" not in {v["name"] for v in scheduler.pod["volumes"]}
    settings = part_settings(docs, "scheduler")
    assert settings["checkpoint_url"] == {
        "scheme": "s3",
        "path": None,
        "bucket": "gpufleet-checkpoints",
        "prefix": "production",
    }
    assert checkpoint_problems(docs, scheduler, settings) == []
    assert environment_problems(docs, scheduler) == []
    # The scheduler's identity for its bucket is its own: the provisioner's credentials
    # are still the provisioner's alone.
    assert credential_problems(docs) == []


def test_the_bucket_component_without_a_bucket_is_refused(tmp_path: Path) -> None:
    docs = render_with_components(tmp_path, "production", (BUCKET,))
    scheduler = workload_of(docs, "scheduler")
    assert checkpoint_problems(docs, scheduler, part_settings(docs, "scheduler")) == [
        "Deployment/gpufleet-scheduler: checkpoint_dir var/checkpoints is on no persistent volume claim"
    ]
