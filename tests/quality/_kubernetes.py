"""The Kubernetes manifests (deploy/kubernetes), rendered by `kubectl kustomize` and read the
way the cluster would: workloads, their containers, what each container is given and what
its image runs. Each check returns the problems it finds, so a test can assert the real
manifests have none and that a broken copy has the one it was broken with."""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.quality._deployfiles import dockerfile_problems, exec_form, parse_dockerfile
from tests.quality._repo import REPO, SERVICES, run

Doc = dict[str, Any]

KUSTOMIZE = REPO / "deploy" / "kubernetes"
OVERLAYS = ("dev", "production")
COMPONENTS = ("prometheus-operator", "incident-webhook")
# The checkpoint bucket's component, with the bucket an overlay would set beside it.
BUCKET = "checkpoints-bucket"
BUCKET_VALUES = {"gpufleet-scheduler": ["GPUFLEET_CHECKPOINT_URL=s3://gpufleet-checkpoints/production"]}
# The control-plane parts the manifests run (the agent runs on the machines).
PARTS = ("scheduler", "reaper", "sweeper", "provisioner")
# Pod label naming a part's role; the network policies select by it.
ROLE_LABEL = "gpufleet.dev/role"
CLOUD_SECRET = "gpufleet-cloud-credentials"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod")
# Images of others' software a manifest may run (the dev overlay's database).
THIRD_PARTY_IMAGES = ("postgres",)


def kubectl() -> str:
    path = shutil.which("kubectl")
    assert path, "kubectl is missing: its `kubectl kustomize` renders deploy/kubernetes (kubectl >= 1.27)"
    return path


def render(directory: Path) -> list[Doc]:
    """What `kubectl kustomize DIR` renders, one dict per resource."""
    result = run([kubectl(), "kustomize", str(directory)], timeout=60)
    assert result.returncode == 0, f"kubectl kustomize {directory}:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def render_with_components(
    tmp: Path, overlay: str, components: tuple[str, ...], values: dict[str, list[str]] | None = None
) -> list[Doc]:
    """An overlay with optional components added, as an operator's own overlay would
    (kustomize takes only relative paths); ``values``: ConfigMap name -> literals merged in."""
    tmp.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(KUSTOMIZE, tmp))
    spec: Doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(rel / "overlays" / overlay)],
        "components": [str(rel / "components" / c) for c in components],
    }
    if values:
        spec["configMapGenerator"] = [
            {"name": name, "behavior": "merge", "literals": literals} for name, literals in values.items()
        ]
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return render(tmp)


def of_kind(docs: list[Doc], kind: str) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d.get("kind") == kind}


# --- workloads and containers ------------------------------------------------------------


@dataclass
class Workload:
    doc: Doc

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])

    @property
    def template(self) -> Doc:
        spec = self.doc["spec"]
        if self.kind == "Pod":
            return self.doc
        if self.kind == "CronJob":
            template: Doc = spec["jobTemplate"]["spec"]["template"]
            return template
        template = spec["template"]
        return template

    @property
    def pod(self) -> Doc:
        pod: Doc = self.template["spec"]
        return pod

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.template.get("metadata", {}).get("labels") or {})

    @property
    def role(self) -> str:
        return self.labels.get(ROLE_LABEL, "")

    def containers(self) -> Iterator[Doc]:
        yield from self.pod.get("initContainers") or []
        yield from self.pod.get("containers") or []

    def main(self) -> Doc:
        container: Doc = self.pod["containers"][0]
        return container

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def workloads(docs: list[Doc]) -> list[Workload]:
    return [Workload(d) for d in docs if d.get("kind") in WORKLOAD_KINDS]


def parts(docs: list[Doc]) -> list[Workload]:
    """The control plane's four workloads, in PARTS' order."""
    return [workload_of(docs, part) for part in PARTS]


def workload_of(docs: list[Doc], role: str) -> Workload:
    found = [w for w in workloads(docs) if w.role == role]
    assert len(found) == 1, f"{len(found)} workloads with {ROLE_LABEL}={role}"
    return found[0]


def selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels and matchExpressions, or a Service's plain map)
    against a pod's labels; an empty selector selects every pod."""
    selector = selector or {}
    plain = "matchLabels" not in selector and "matchExpressions" not in selector
    match = selector if plain else selector.get("matchLabels") or {}
    if any(labels.get(k) != v for k, v in match.items()):
        return False
    for expr in [] if plain else selector.get("matchExpressions") or []:
        value, op, values = labels.get(expr["key"]), expr["operator"], expr.get("values") or []
        ok = {
            "In": value in values,
            "NotIn": value not in values,
            "Exists": value is not None,
            "DoesNotExist": value is None,
        }[op]
        if not ok:
            return False
    return True


def image_name(image: str) -> str:
    """`registry.example.com/gpufleet/scheduler:0.1.0` -> `gpufleet/scheduler`."""
    without_tag = image.split("@")[0].rsplit(":", 1)[0] if ":" in image.split("/")[-1] else image
    parts = without_tag.split("/")
    return "/".join(parts[-2:]) if len(parts) >= 2 else parts[0]


def dockerfile_for(image: str) -> Path | None:
    """The Dockerfile that builds a gpufleet image, None for another's image."""
    name = image_name(image)
    if not name.startswith("gpufleet/"):
        return None
    short = name.split("/", 1)[1]
    if short == "migrate":
        return REPO / "deploy" / "migrate.Dockerfile"
    return REPO / "services" / short / "Dockerfile"


def argv_of(container: Doc) -> list[str]:
    """What the container runs: its command and args, or its image's CMD."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if command:
        return command + args
    dockerfile = dockerfile_for(container["image"])
    assert dockerfile is not None, f"{container['name']}: no command and no Dockerfile to read its CMD from"
    cmds = parse_dockerfile(dockerfile)[-1].args("CMD")
    return exec_form(cmds[-1]) + args


def command_problems(workload: Workload) -> list[str]:
    """Each gpufleet container's command exists in its image: `python -m MODULE` of a
    package its Dockerfile installs (with the store extra for the database's modules), or a
    console script one of those packages declares."""
    problems = []
    for container in workload.containers():
        where = f"{workload}/{container['name']}"
        dockerfile = dockerfile_for(container["image"])
        if dockerfile is None:
            if image_name(container["image"]) not in THIRD_PARTY_IMAGES:
                problems.append(f"{where}: image {container['image']} is neither gpufleet's nor known")
            continue
        if not dockerfile.is_file():
            problems.append(f"{where}: image {container['image']}: no {dockerfile.relative_to(REPO)}")
            continue
        argv = argv_of(container)
        installs = " ".join(parse_dockerfile(dockerfile)[0].args("RUN"))
        if argv[:2] == ["python", "-m"]:
            problems += [f"{where}: {p}" for p in dockerfile_problems(dockerfile, argv)]
            if argv[2].startswith("gpufleet.common.db") and "libs/common[store]" not in installs:
                problems.append(f"{where}: {argv[2]} needs gpufleet-common[store], which the image lacks")
        elif argv[0] not in console_scripts(dockerfile):
            problems.append(f"{where}: {argv[0]} is no command the image {container['image']} installs")
    return problems


def console_scripts(dockerfile: Path) -> set[str]:
    """The console scripts of the packages a Dockerfile copies in and installs."""
    found: set[str] = set()
    for stage in parse_dockerfile(dockerfile):
        for args in stage.args("COPY"):
            words = [w for w in args.split() if not w.startswith("--")]
            for src in words[:-1]:
                pyproject = REPO / src / "pyproject.toml"
                if pyproject.is_file():
                    project = tomllib.loads(pyproject.read_text()).get("project", {})
                    found |= set(project.get("scripts", {}))
    return found


# --- what a container is given -----------------------------------------------------------


def secret_value(docs: list[Doc], name: str, key: str) -> str:
    """A Secret's value when the render holds it (the dev overlay's), else a stand-in for
    what the cluster's Secret holds (a database URL under `url`)."""
    secret = of_kind(docs, "Secret").get(name)
    if secret is not None:
        if key in (secret.get("stringData") or {}):
            return str(secret["stringData"][key])
        if key in (secret.get("data") or {}):
            return base64.b64decode(secret["data"][key]).decode()
    return "postgresql://gpufleet@database.example:5432/gpufleet" if key == "url" else "secret"


def environment(docs: list[Doc], container: Doc) -> dict[str, str]:
    """Every variable the container gets, as the kubelet would set it (env wins over
    envFrom; a Secret's or field's value by stand-in where the render cannot know it)."""
    values: dict[str, str] = {}
    configmaps = of_kind(docs, "ConfigMap")
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        if "configMapRef" in source:
            data = configmaps[source["configMapRef"]["name"]].get("data") or {}
            values |= {prefix + k: str(v) for k, v in data.items()}
        else:
            values[f"<envFrom secret {source['secretRef']['name']}>"] = ""
    for item in container.get("env") or []:
        if "value" in item:
            values[item["name"]] = str(item["value"])
            continue
        ref = item.get("valueFrom", {})
        if "secretKeyRef" in ref:
            values[item["name"]] = secret_value(docs, ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
        elif "configMapKeyRef" in ref:
            cm = configmaps[ref["configMapKeyRef"]["name"]]
            values[item["name"]] = str((cm.get("data") or {})[ref["configMapKeyRef"]["key"]])
        else:
            values[item["name"]] = "gpufleet-part-0"  # a fieldRef: the pod's name
    return values


@dataclass
class Reader:
    """What one container's program reads: the variables, and the settings it ends up with."""

    module: str
    variables: frozenset[str]
    settings: dict[str, Any] | None  # None: the program has no typed settings (migrate)
    error: str = ""


_DUMP = """
import json, sys
from importlib import import_module
settings_cls = import_module(sys.argv[1]).Settings
names = {"GPUFLEET_CONFIG_FILE"}
for name, field in settings_cls.model_fields.items():
    alias = field.validation_alias
    names.add(alias.upper() if isinstance(alias, str) else "GPUFLEET_" + name.upper())
try:
    values = settings_cls().model_dump(mode="json")
    error = ""
except Exception as exc:
    values, error = None, str(exc)
print(json.dumps({"variables": sorted(names), "settings": values, "error": error}))
"""


def reader_of(container: Doc, env: dict[str, str]) -> Reader | None:
    """Build the program's own typed settings from the container's environment, in a
    process of its own (as the container would): which variables it reads and the values
    it takes. None for a program that is not gpufleet's."""
    argv = argv_of(container) if dockerfile_for(container["image"]) else []
    if argv[:2] != ["python", "-m"]:
        return None
    return _reader(argv[2], tuple(sorted(env.items())))


@functools.lru_cache(maxsize=256)
def _reader(module: str, env_items: tuple[tuple[str, str], ...]) -> Reader:
    env = dict(env_items)
    service = module.removeprefix("gpufleet.")
    if service in SERVICES:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
        result = subprocess.run(
            [sys.executable, "-c", _DUMP, f"gpufleet.{service}.settings"],
            cwd=REPO,
            env={**clean, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        dumped = json.loads(result.stdout.strip().splitlines()[-1])
        return Reader(module, frozenset(dumped["variables"]), dumped["settings"], dumped["error"])
    # A program without typed settings reads what its source names.
    path = REPO / "libs" / "common" / Path(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        return Reader(module, frozenset(), None, f"no source for {module}")
    names = re.findall(r"os\.environ(?:\.get\(|\[)\"([A-Z0-9_]+)\"", path.read_text())
    return Reader(module, frozenset(names), None)


def environment_problems(docs: list[Doc], workload: Workload) -> list[str]:
    """Every variable a gpufleet container is given is one its program reads, and the
    program's settings accept every value."""
    problems = []
    for container in workload.containers():
        env = environment(docs, container)
        reader = reader_of(container, env)
        if reader is None:
            continue
        where = f"{workload}/{container['name']}"
        for name in sorted(set(env) - reader.variables):
            problems.append(f"{where}: {name} is not a setting {reader.module} reads")
        if reader.error:
            problems.append(f"{where}: {reader.module} refuses its settings: {reader.error}")
    return problems


def container_env(docs: list[Doc], part: str) -> list[Doc]:
    """The part's main container's env list, to change in a test's copy."""
    env: list[Doc] = workload_of(docs, part).main()["env"]
    return env


def config_map(docs: list[Doc], prefix: str) -> Doc:
    """A generated ConfigMap by its name before kustomize's hash suffix."""
    return next(cm for name, cm in of_kind(docs, "ConfigMap").items() if name.startswith(prefix + "-"))


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def host_of(address: str) -> str:
    return address.rsplit(":", 1)[0]
