"""Checks of rendered Kubernetes manifests, each returning the problems it finds: ports
against the services' own settings, the pods' security, who holds which Secret, the
migrations before the services, replicas and disruption budgets."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate

from tests.quality._deployfiles import CREDENTIAL_ENV, CREDENTIAL_MOUNT
from tests.quality._kubernetes import (
    CLOUD_SECRET,
    PARTS,
    Doc,
    Reader,
    Workload,
    environment,
    host_of,
    of_kind,
    port_of,
    reader_of,
    selects,
    workload_of,
    workloads,
)

# What each part's settings dial, and which part answers there.
DIALS = {"provisioner_address": "provisioner", "scheduler_address": "scheduler"}
# A workload identity, on a ServiceAccount: only the provisioner's may carry one.
CLOUD_IDENTITY = re.compile(r"^(iam\.gke\.io/|eks\.amazonaws\.com/|azure\.workload\.identity/)")
# The keys cert-manager writes into a Certificate's Secret; the base mounts them as they are.
TLS_KEYS = ("ca.crt", "tls.crt", "tls.key")
MIN_REPLICAS = {"scheduler": 2, "reaper": 2, "sweeper": 2, "provisioner": 1}


def main_reader(docs: list[Doc], workload: Workload) -> Reader | None:
    container = workload.main()
    return reader_of(container, environment(docs, container))


def part_settings(docs: list[Doc], part: str) -> dict[str, Any]:
    """The settings a part's service builds from what its manifests give it."""
    reader = main_reader(docs, workload_of(docs, part))
    assert reader is not None and reader.settings is not None, part
    return reader.settings


def _container_ports(container: Doc) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in container.get("ports") or [] if "name" in p}


def _target_port(port: Doc, container: Doc) -> int | None:
    target = port.get("targetPort", port["port"])
    if isinstance(target, int):
        return target if target in _container_ports(container).values() else None
    return _container_ports(container).get(str(target))


def services_of(docs: list[Doc], workload: Workload) -> list[Doc]:
    return [
        s for s in of_kind(docs, "Service").values() if selects(s["spec"].get("selector"), workload.labels)
    ]


def port_problems(docs: list[Doc], workload: Workload, settings: dict[str, Any]) -> list[str]:
    """The ports a part listens on (from its own settings) are the container's ports, its
    probes' and its Services' targets; the addresses it dials are Services of the part
    meant, on the port that part listens on."""
    problems: list[str] = []
    container = workload.main()
    ports = _container_ports(container)
    for port_name, setting in (
        ("grpc", "listen_address"),
        ("health", "health_listen_address"),
        ("metrics", "metrics_address"),
    ):
        address = settings.get(setting) or ""
        if not address:
            problems.append(f"{workload}: {setting} is not set: the pod serves no {port_name} port")
            continue
        if host_of(address) not in ("0.0.0.0", "[::]"):
            problems.append(f"{workload}: {setting}={address} is out of the kubelet's and Services' reach")
        if ports.get(port_name) != port_of(address):
            problems.append(
                f"{workload}: {setting} listens on {port_of(address)}, "
                f"the container's {port_name} port is {ports.get(port_name)}"
            )
    health = ports.get("health")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec = container.get(probe)
        if not spec or "grpc" not in spec:
            problems.append(f"{workload}: no native gRPC {probe}")
        elif spec["grpc"].get("port") != health:
            problems.append(
                f"{workload}: {probe} asks port {spec['grpc'].get('port')}, health is on {health}"
            )
    annotated = workload.template.get("metadata", {}).get("annotations", {}).get("prometheus.io/port")
    if annotated is not None and int(annotated) != ports.get("metrics"):
        problems.append(f"{workload}: prometheus.io/port {annotated}, metrics on {ports.get('metrics')}")
    if not services_of(docs, workload):
        problems.append(f"{workload}: no Service selects it")
    for service in services_of(docs, workload):
        for port in service["spec"]["ports"]:
            if _target_port(port, container) is None:
                problems.append(
                    f"Service/{service['metadata']['name']}: port {port['port']} targets "
                    f"{port.get('targetPort')}, which {workload} does not serve"
                )
    for setting, part in DIALS.items():
        if settings.get(setting):
            problems += _dial_problems(docs, workload, setting, settings[setting], part)
    return problems


def _dial_problems(docs: list[Doc], workload: Workload, setting: str, address: str, part: str) -> list[str]:
    target = next((w for w in workloads(docs) if w.role == part), None)
    if target is None:
        return [f"{workload}: {setting}={address}: no {part} in the manifests"]
    grpc = _container_ports(target.main()).get("grpc")
    name = host_of(address).split(".")[0] if ".svc" in host_of(address) else host_of(address)
    services = of_kind(docs, "Service")
    # An in-cluster name must be a Service of that part; any other name (the machines'
    # load balancer in private DNS) must reach that part through one of its Services.
    candidates = [services[name]] if name in services else services_of(docs, target)
    if name in services and not selects(services[name]["spec"].get("selector"), target.labels):
        return [f"{workload}: {setting}={address}: Service {name} does not select the {part}"]
    for service in candidates:
        for port in service["spec"]["ports"]:
            if port["port"] == port_of(address) and _target_port(port, target.main()) == grpc:
                return []
    return [
        f"{workload}: {setting}={address}: no Service port {port_of(address)} leads to the {part}'s gRPC port"
    ]


# --- security ---------------------------------------------------------------------------------

_UNITS = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}


def quantity(value: str | int | float) -> float:
    text = str(value)
    for unit, factor in _UNITS.items():
        if text.endswith(unit):
            return float(text[: -len(unit)]) * factor
    return float(text)


def security_problems(workload: Workload) -> list[str]:
    """Non-root, read-only root file system, no privilege escalation, every capability
    dropped, seccomp RuntimeDefault, no service-account token, requests and limits."""
    problems: list[str] = []
    pod = workload.pod
    pod_sc = pod.get("securityContext") or {}
    if pod.get("automountServiceAccountToken") is not False:
        problems.append(f"{workload}: mounts a service-account token (it calls no Kubernetes API)")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(flag):
            problems.append(f"{workload}: {flag}")
    for container in workload.containers():
        where = f"{workload}/{container['name']}"
        sc = container.get("securityContext") or {}
        merged = {**pod_sc, **sc}
        if merged.get("runAsNonRoot") is not True or merged.get("runAsUser", 0) == 0:
            problems.append(f"{where}: may run as root (runAsNonRoot and a non-zero runAsUser)")
        if (merged.get("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{where}: seccomp profile is not RuntimeDefault")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: the root file system is writable")
        if sc.get("privileged"):
            problems.append(f"{where}: privileged")
        caps = sc.get("capabilities") or {}
        if caps.get("drop") != ["ALL"] or caps.get("add"):
            problems.append(f"{where}: capabilities not all dropped")
        resources = container.get("resources") or {}
        for resource in ("cpu", "memory"):
            request = (resources.get("requests") or {}).get(resource)
            limit = (resources.get("limits") or {}).get(resource)
            if request is None or limit is None:
                problems.append(f"{where}: no {resource} request and limit")
            elif quantity(request) > quantity(limit):
                problems.append(f"{where}: {resource} request {request} above its limit {limit}")
    return problems


# --- Secrets ----------------------------------------------------------------------------------


def secret_mounts(workload: Workload) -> dict[str, str]:
    """Volume name -> the Secret it mounts."""
    found = {}
    for volume in workload.pod.get("volumes") or []:
        if "secret" in volume:
            found[volume["name"]] = volume["secret"]["secretName"]
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "secret" in source:
                found[volume["name"]] = source["secret"]["name"]
    return found


def secrets_referenced(workload: Workload) -> set[str]:
    """Every Secret a workload's pods name: volumes, env, envFrom."""
    names = set(secret_mounts(workload).values())
    for container in workload.containers():
        for item in container.get("env") or []:
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                names.add(source["secretRef"]["name"])
    return names


def credential_problems(docs: list[Doc]) -> list[str]:
    """Only the provisioner holds cloud credentials: the Secret, a workload identity on its
    ServiceAccount, a credential variable or a credentials folder."""
    problems: list[str] = []
    holders = [w for w in workloads(docs) if CLOUD_SECRET in secrets_referenced(w)]
    for workload in holders:
        if workload.role != "provisioner":
            problems.append(f"{workload} references the cloud credentials Secret {CLOUD_SECRET}")
    if not any(w.role == "provisioner" for w in holders):
        problems.append(f"the provisioner does not mount {CLOUD_SECRET}")
    accounts = of_kind(docs, "ServiceAccount")
    for workload in workloads(docs):
        account = workload.pod.get("serviceAccountName", "default")
        annotations = (accounts.get(account, {}).get("metadata", {}).get("annotations")) or {}
        identity = [k for k in annotations if CLOUD_IDENTITY.match(k)]
        if workload.role != "provisioner" and (identity or account == "gpufleet-provisioner"):
            problems.append(f"{workload} runs as ServiceAccount {account}, which may carry a cloud identity")
        if workload.role == "provisioner":
            continue
        for container in workload.containers():
            for item in container.get("env") or []:
                if CREDENTIAL_ENV.match(item["name"]):
                    problems.append(
                        f"{workload}/{container['name']}: cloud credential variable {item['name']}"
                    )
            for mount in container.get("volumeMounts") or []:
                if CREDENTIAL_MOUNT.search(mount["mountPath"]):
                    problems.append(
                        f"{workload}/{container['name']}: credentials folder {mount['mountPath']}"
                    )
    return problems


def tls_problems(docs: list[Doc], workload: Workload, settings: dict[str, Any]) -> list[str]:
    """Each part reads its certificate, key and trust bundle from its own Secret,
    gpufleet-<role>-tls, mounted whole (a rotated Secret reaches the files); the machine CA
    only in the provisioner; no part mounts another's."""
    problems: list[str] = []
    role = workload.role
    mounted = secret_mounts(workload)
    container = workload.main()
    paths = {s: settings.get(s) for s in ("tls_ca_file", "tls_cert_file", "tls_key_file")}
    expected = {s: f"gpufleet-{role}-tls" for s in paths}
    if role == "provisioner":
        for setting in ("tls_machine_ca_cert_file", "tls_machine_ca_key_file"):
            paths[setting] = settings.get(setting)
            expected[setting] = "gpufleet-machine-ca"
    for other in [*PARTS, "machine"]:
        name = "gpufleet-machine-ca" if other == "machine" else f"gpufleet-{other}-tls"
        if name in mounted.values() and name not in expected.values():
            problems.append(f"{workload} mounts {name}, another part's")
    mounts = {m["mountPath"]: m for m in container.get("volumeMounts") or []}
    volumes = {v["name"]: v for v in workload.pod.get("volumes") or []}
    for setting, path in paths.items():
        if not path:
            problems.append(f"{workload}: {setting} is not set")
            continue
        folder, _, file = path.rpartition("/")
        mount = mounts.get(folder)
        if mount is None or mounted.get(mount["name"]) != expected[setting]:
            problems.append(f"{workload}: {setting}={path} is not in the mounted Secret {expected[setting]}")
            continue
        if mount.get("subPath"):
            problems.append(f"{workload}: {folder} is mounted by subPath: a rotated Secret never reaches it")
        items = volumes[mount["name"]]["secret"].get("items")
        files = [i["path"] for i in items] if items else list(TLS_KEYS)
        if file not in files:
            problems.append(f"{workload}: {setting}={path}: the Secret's volume has no {file}")
    return problems


# --- order and availability -------------------------------------------------------------------


def migration_problems(docs: list[Doc], workload: Workload, settings: dict[str, Any]) -> list[str]:
    """A part with database access starts only once its own image brought the schema to
    its head: an init container running the migrations, on the same database."""
    if "database_url" not in settings:
        return []
    main = workload.main()
    for init in workload.pod.get("initContainers") or []:
        argv = list(init.get("command") or []) + list(init.get("args") or [])
        if argv[:3] != ["python", "-m", "gpufleet.common.db.migrate"]:
            continue
        problems = []
        if init["image"] != main["image"]:
            problems.append(f"{workload}: migrates with {init['image']}, runs {main['image']}")
        if environment(docs, init).get("GPUFLEET_DATABASE_URL") != settings["database_url"]:
            problems.append(f"{workload}: its migrations and its service use different databases")
        return problems
    return [f"{workload}: nothing migrates the database before it starts"]


def availability_problems(docs: list[Doc]) -> list[str]:
    """Replicas (a standby for every leader), one disruption budget per part that lets a
    drain go on and keeps one replica up, a checkpoint folder every scheduler shares."""
    problems: list[str] = []
    budgets = of_kind(docs, "PodDisruptionBudget").values()
    for workload in workloads(docs):
        if workload.kind != "Deployment":
            continue
        replicas = int(workload.doc["spec"].get("replicas", 1))
        if replicas < MIN_REPLICAS.get(workload.role, 1):
            problems.append(f"{workload}: {replicas} replica(s), at least {MIN_REPLICAS[workload.role]}")
        mine = [b for b in budgets if selects(b["spec"]["selector"], workload.labels)]
        if len(mine) != 1:
            problems.append(f"{workload}: {len(mine)} PodDisruptionBudgets select it")
            continue
        spec = mine[0]["spec"]
        if "minAvailable" in spec:
            if int(spec["minAvailable"]) >= replicas:
                problems.append(f"{workload}: minAvailable {spec['minAvailable']} of {replicas}: no drain")
            if replicas > 1 and int(spec["minAvailable"]) < 1:
                problems.append(f"{workload}: its budget lets every replica go at once")
        elif int(spec.get("maxUnavailable", 0)) < 1:
            problems.append(f"{workload}: maxUnavailable 0: no drain")
        elif replicas > 1 and int(spec["maxUnavailable"]) >= replicas:
            problems.append(f"{workload}: its budget lets every replica go at once")
    return problems


def checkpoint_problems(
    docs: list[Doc], workload: Workload, settings: dict[str, Any], *, one_node: bool = False
) -> list[str]:
    """Every scheduler replica sees one checkpoint folder: a claim every replica mounts,
    ReadWriteMany unless the cluster is one node (the dev overlay's) — or a bucket
    (GPUFLEET_CHECKPOINT_URL, which wins over the folder)."""
    folder = settings.get("checkpoint_dir")
    if not folder or settings.get("checkpoint_url"):
        return []
    mounts = {m["mountPath"]: m["name"] for m in workload.main().get("volumeMounts") or []}
    volumes = {v["name"]: v for v in workload.pod.get("volumes") or []}
    volume = volumes.get(mounts.get(folder, ""), {})
    claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
    if claim is None:
        return [f"{workload}: checkpoint_dir {folder} is on no persistent volume claim"]
    modes = of_kind(docs, "PersistentVolumeClaim")[claim]["spec"]["accessModes"]
    if "ReadWriteMany" not in modes and not one_node:
        return [f"{workload}: claim {claim} is {modes}: replicas on other nodes cannot mount it"]
    return []


# The oldest Kubernetes the manifests are for (native gRPC probes are GA from 1.27) and the
# newest whose schemas kubernetes-validate carries.
OLDEST = "1.27.0"
NEWEST = kubernetes_validate.latest_version()
# Kinds that come with an operator's CRDs: only the optional components use them.
CRD_KINDS = {"PodMonitor", "Certificate", "Issuer", "ClusterIssuer"}


def schema_problems(docs: list[Doc], version: str) -> list[str]:
    """Each document against its kind's schema for ``version`` (strict: no unknown field); a
    kind with no schema is a problem unless an operator's CRD brings it."""
    problems = []
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            if doc["kind"] not in CRD_KINDS:
                problems.append(f"{name}: no schema for {doc['apiVersion']} {doc['kind']} in {version}")
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            problems.append(f"{name}: {path}: {exc.message}")
    return problems
