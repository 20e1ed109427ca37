"""The two ways deploy/kubernetes gets its certificates, rendered by `kubectl kustomize` into
the overlays: components/cert-manager (a Certificate per part) and components/certs-job
(`python -m gpufleet.common.trust.issue` run as the Job's manifest runs it). Either fills
every Secret the base and the other components mount, and each part's certificate names its
identity — the URI and the one DNS name of gpufleet.common.trust.identity — and nothing else.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from gpufleet.common.trust import issue
from gpufleet.common.trust.identity import SERVICE_ROLES, Identity, Role
from gpufleet.common.trust.peer import identity_from_auth_context
from gpufleet.common.trust.pki import machine_ca_subject, root_subject
from tests.quality._kubernetes_checks import NEWEST, OLDEST, schema_problems

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO / "deploy" / "kubernetes"
OVERLAYS = ("dev", "production")
Doc = dict[str, Any]


def render(tmp: Path, overlay: str, component: str) -> list[Doc]:
    """The overlay with the component added, as an operator's overlay lists it."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is missing: its `kubectl kustomize` renders deploy/kubernetes"
    tmp.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(KUSTOMIZE, tmp))
    namespace = yaml.safe_load((KUSTOMIZE / "overlays" / overlay / "kustomization.yaml").read_text())[
        "namespace"
    ]
    spec = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace,
        "resources": [str(rel / "overlays" / overlay)],
        "components": [str(rel / "components" / component)],
    }
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run(
        [kubectl, "kustomize", str(tmp)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def of_kind(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def deployment_id(docs: list[Doc]) -> str:
    (common,) = [
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("gpufleet-common")
    ]
    return str(common["data"]["GPUFLEET_DEPLOYMENT_ID"])


def mounted_secrets(docs: list[Doc]) -> set[str]:
    """Every certificate Secret a workload mounts, and the scraper's (the PodMonitors')."""
    names = set()
    for doc in docs:
        if doc["kind"] in ("Deployment", "StatefulSet"):
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                name = volume.get("secret", {}).get("secretName", "")
                if name.endswith("-tls") or name == "gpufleet-machine-ca":
                    names.add(name)
    return names | {"gpufleet-metrics-tls"}


def common_name(name: x509.Name) -> str:
    return str(name.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


@pytest.fixture(scope="module", params=OVERLAYS)
def cert_manager(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    return render(tmp_path_factory.mktemp("cert-manager"), request.param, "cert-manager")


@pytest.fixture(scope="module", params=OVERLAYS)
def certs_job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    return render(tmp_path_factory.mktemp("certs-job"), request.param, "certs-job")


def test_both_certificate_components_render_and_validate(
    cert_manager: list[Doc], certs_job: list[Doc]
) -> None:
    # The Job, CronJob, RBAC and network policy against the Kubernetes schemas, oldest and
    # newest (cert-manager's own kinds come with its CRDs).
    for docs in (cert_manager, certs_job):
        assert schema_problems(docs, OLDEST) == schema_problems(docs, NEWEST) == []
    assert {"Job", "CronJob", "Role", "RoleBinding", "ServiceAccount"} <= {d["kind"] for d in certs_job}


# ---- cert-manager ----------------------------------------------------------------------------


def test_each_part_s_certificate_names_its_identity_and_nothing_else(cert_manager: list[Doc]) -> None:
    deployment = deployment_id(cert_manager)
    certificates = of_kind(cert_manager, "Certificate")
    parts = {c["spec"]["secretName"]: c["spec"] for c in certificates.values() if not c["spec"].get("isCA")}
    assert set(parts) == {f"gpufleet-{role.value}-tls" for role in SERVICE_ROLES}
    for role in SERVICE_ROLES:
        spec = parts[f"gpufleet-{role.value}-tls"]
        identity = Identity(role, deployment)
        assert spec["uris"] == [identity.uri], role
        assert spec["dnsNames"] == identity.server_names, role
        assert not spec.get("ipAddresses") and not spec.get("emailAddresses"), role
        assert {"server auth", "client auth"} <= set(spec["usages"]), role
        assert spec["issuerRef"]["name"] == "gpufleet-ca", role
        assert spec["duration"] == "720h", role  # thirty days, as gpufleet's own issuing


def test_the_cas_bear_the_names_the_parts_accept_from(cert_manager: list[Doc]) -> None:
    """A part takes a service's certificate only from "gpufleet <id> root CA" and a machine's
    only from "gpufleet <id> machine CA" (gpufleet.common.trust.peer)."""
    deployment = deployment_id(cert_manager)
    certificates = of_kind(cert_manager, "Certificate")
    root, machine = certificates["gpufleet-root-ca"]["spec"], certificates["gpufleet-machine-ca"]["spec"]
    assert root["isCA"] and root["commonName"] == common_name(root_subject(deployment))
    assert not root.get("subject")  # the name is the common name alone
    assert root["secretName"] == "gpufleet-ca" and root["privateKey"]["rotationPolicy"] == "Never"
    assert machine["isCA"] and machine["commonName"] == common_name(machine_ca_subject(deployment))
    assert machine["secretName"] == "gpufleet-machine-ca" and machine["issuerRef"]["name"] == "gpufleet-ca"
    issuers = of_kind(cert_manager, "Issuer")
    assert issuers["gpufleet-ca"]["spec"]["ca"]["secretName"] == "gpufleet-ca"


def test_cert_manager_fills_every_secret_that_is_mounted(cert_manager: list[Doc]) -> None:
    written = {c["spec"]["secretName"] for c in of_kind(cert_manager, "Certificate").values()}
    assert mounted_secrets(cert_manager) <= written
    ours = [
        d
        for d in cert_manager
        if d["kind"] in ("Certificate", "Issuer") or "trust-domain" in d["metadata"]["name"]
    ]
    assert not re.search(r"\bDEPLOYMENT\b", yaml.safe_dump_all(ours))  # every placeholder replaced


# ---- the certs Job, run as its manifest runs it ---------------------------------------------------


def run_issue_step(job_spec: Doc, deployment: str, root: Path) -> Path:
    """`python -m gpufleet.common.trust.issue` with the Job's own arguments, each mount path
    a folder under ``root``; returns the folder `kubectl apply` reads."""
    pod = job_spec["template"]["spec"]
    (step,) = pod["initContainers"]
    assert step["command"] == ["python", "-m", "gpufleet.common.trust.issue"]
    mounts = {m["mountPath"]: root / m["name"] for m in step["volumeMounts"]}
    args = []
    for arg in step["args"]:
        arg = arg.replace("$(GPUFLEET_DEPLOYMENT_ID)", deployment)
        for path, folder in mounts.items():
            arg = re.sub(rf"={re.escape(path)}(?=/|$)", f"={folder}", arg)
        args.append(arg)
    for folder in mounts.values():
        folder.mkdir(parents=True, exist_ok=True)
    assert issue.main(args) == 0
    (apply,) = pod["containers"]
    assert apply["command"] == ["/bin/kubectl"] and apply["args"][:2] == ["apply", "--server-side"]
    (target,) = [a.removeprefix("--filename=") for a in apply["args"] if a.startswith("--filename=")]
    (apply_mount,) = [m for m in apply["volumeMounts"] if target.startswith(m["mountPath"])]
    return root / apply_mount["name"] / Path(target).relative_to(apply_mount["mountPath"])


def secrets_in(folder: Path) -> dict[str, Doc]:
    found = {}
    for path in sorted(folder.iterdir()):
        doc = json.loads(path.read_text())
        assert doc["kind"] == "Secret"
        found[doc["metadata"]["name"]] = doc
    return found


def data_of(secret: Doc) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def test_the_job_fills_every_secret_that_is_mounted_and_may_write_only_those(
    certs_job: list[Doc], tmp_path: Path
) -> None:
    deployment = deployment_id(certs_job)
    job = of_kind(certs_job, "Job")["gpufleet-certs"]
    written = secrets_in(run_issue_step(job["spec"], deployment, tmp_path / "run"))
    assert mounted_secrets(certs_job) <= set(written)
    for name, secret in written.items():
        assert secret["type"] == "kubernetes.io/tls", name
        data = data_of(secret)
        if name.endswith("-tls"):
            leaf = data["tls.crt"].split(b"-----END CERTIFICATE-----")[0] + b"-----END CERTIFICATE-----\n"
            identity = identity_from_auth_context({"x509_pem_cert": [leaf]})
            assert identity is not None and f"gpufleet-{identity}-tls" == name
            assert identity.role in SERVICE_ROLES and identity.deployment == deployment
            names = x509.load_pem_x509_certificate(leaf).extensions.get_extension_for_class(
                x509.SubjectAlternativeName
            )
            assert len(list(names.value)) == 2  # its URI and its DNS name, no other
    (role,) = of_kind(certs_job, "Role").values()
    allowed = {n for rule in role["rules"] if "patch" in rule["verbs"] for n in rule.get("resourceNames", [])}
    assert set(written) == allowed


def test_the_job_s_next_run_keeps_the_ca_and_the_cronjob_runs_the_same_pod(
    certs_job: list[Doc], tmp_path: Path
) -> None:
    deployment = deployment_id(certs_job)
    job = of_kind(certs_job, "Job")["gpufleet-certs"]
    first = secrets_in(run_issue_step(job["spec"], deployment, tmp_path / "first"))
    # The next run sees the gpufleet-ca Secret it wrote, mounted where the Job mounts it.
    second_root = tmp_path / "second"
    (ca_volume,) = [v for v in job["spec"]["template"]["spec"]["volumes"] if "secret" in v]
    assert ca_volume["secret"] == {"secretName": "gpufleet-ca", "optional": True, "defaultMode": 0o440}
    (second_root / ca_volume["name"]).mkdir(parents=True)
    for key, content in data_of(first["gpufleet-ca"]).items():
        (second_root / ca_volume["name"] / key).write_bytes(content)
    second = secrets_in(run_issue_step(job["spec"], deployment, second_root))
    assert data_of(second["gpufleet-ca"]) == data_of(first["gpufleet-ca"])
    assert data_of(second["gpufleet-scheduler-tls"])["ca.crt"] == data_of(first["gpufleet-ca"])["tls.crt"]
    assert (
        data_of(second["gpufleet-scheduler-tls"])["tls.crt"]
        != data_of(first["gpufleet-scheduler-tls"])["tls.crt"]
    )

    cron = of_kind(certs_job, "CronJob")["gpufleet-certs-renew"]
    assert cron["spec"]["jobTemplate"]["spec"]["template"] == job["spec"]["template"]


def test_the_machine_ca_the_job_writes_is_what_the_provisioner_signs_with(
    certs_job: list[Doc], tmp_path: Path
) -> None:
    deployment = deployment_id(certs_job)
    job = of_kind(certs_job, "Job")["gpufleet-certs"]
    machine_ca = data_of(secrets_in(run_issue_step(job["spec"], deployment, tmp_path))["gpufleet-machine-ca"])
    cert = x509.load_pem_x509_certificate(machine_ca["tls.crt"])
    assert cert.subject == machine_ca_subject(deployment)
    assert x509.load_pem_x509_certificate(machine_ca["ca.crt"]).subject == root_subject(deployment)
    assert Role.MACHINE not in SERVICE_ROLES  # machines' certificates come from the provisioner
