"""Import boundaries (DESIGN.md §1, §13): the import-linter contracts in .importlinter hold on
the tree, each kind of contract demonstrably fails on a deliberate violation, and each
package's declared dependency set and settings follow the same walls."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.quality._repo import PACKAGE_DIRS, REPO, SERVICES, copy_tree, run, tool

CLOUD_CONTRACT = "Cloud SDKs are imported only under gpufleet.provisioner"
INDEPENDENCE_CONTRACT = "Services (and the CLI) never import each other: they talk over gRPC"
SHARED_CONTRACT = "gpufleet.common and gpufleet.v1 import no service and not the CLI"
PROTOS_CONTRACT = "gpufleet.v1 (generated contracts) imports nothing of gpufleet.common"
NVML_CONTRACT = "NVML (pynvml) is imported only under gpufleet.agent"
DATABASE_CONTRACT = "The agent, the provisioner and the CLI have no database access"
ALL_CONTRACTS = (
    CLOUD_CONTRACT,
    INDEPENDENCE_CONTRACT,
    SHARED_CONTRACT,
    PROTOS_CONTRACT,
    NVML_CONTRACT,
    DATABASE_CONTRACT,
)


def lint_imports(root: Path) -> tuple[int, str]:
    """Run lint-imports with ``root`` as the repository: its .importlinter, its packages first
    on the path (ahead of the editable installs, which point at the real tree)."""
    pythonpath = ":".join(str(root / d) for d in PACKAGE_DIRS.values())
    result = run([tool("lint-imports"), "--no-cache", "--no-logo"], cwd=root, env={"PYTHONPATH": pythonpath})
    return result.returncode, result.stdout + result.stderr


def test_the_tree_keeps_every_import_contract() -> None:
    code, output = lint_imports(REPO)
    assert code == 0, output
    for name in ALL_CONTRACTS:
        assert f"{name} KEPT" in output, output


# (file to add, its source, the contract it must break, the chain's first importer)
VIOLATIONS = [
    pytest.param(
        "services/scheduler/gpufleet/scheduler/_violation.py",
        "import boto3\n",
        CLOUD_CONTRACT,
        "gpufleet.scheduler._violation",
        id="scheduler-imports-boto3",
    ),
    pytest.param(
        "services/sweeper/gpufleet/sweeper/_violation.py",
        "from google.cloud import compute_v1\n",
        CLOUD_CONTRACT,
        "gpufleet.sweeper._violation",
        id="sweeper-imports-google-cloud",
    ),
    pytest.param(
        "libs/common/gpufleet/common/_violation.py",
        "import google.api_core.retry\n",
        CLOUD_CONTRACT,
        "gpufleet.common._violation",
        id="common-imports-api-core",
    ),
    pytest.param(
        "services/reaper/gpufleet/reaper/_violation.py",
        "from gpufleet.scheduler import settings\n",
        INDEPENDENCE_CONTRACT,
        "gpufleet.reaper._violation",
        id="reaper-imports-scheduler",
    ),
    pytest.param(
        "libs/cli/gpufleet/cli/_violation.py",
        "import gpufleet.provisioner\n",
        INDEPENDENCE_CONTRACT,
        "gpufleet.cli._violation",
        id="cli-imports-provisioner",
    ),
    pytest.param(
        "libs/common/gpufleet/common/_violation.py",
        "import gpufleet.agent\n",
        SHARED_CONTRACT,
        "gpufleet.common._violation",
        id="common-imports-agent",
    ),
    pytest.param(
        "protos/gpufleet/v1/_violation.py",
        "import gpufleet.common.errors\n",
        PROTOS_CONTRACT,
        "gpufleet.v1._violation",
        id="protos-import-common",
    ),
    pytest.param(
        "services/reaper/gpufleet/reaper/_violation.py",
        "import pynvml\n",
        NVML_CONTRACT,
        "gpufleet.reaper._violation",
        id="reaper-imports-nvml",
    ),
    pytest.param(
        "services/agent/gpufleet/agent/_violation.py",
        "from gpufleet.common.db import models\n",
        DATABASE_CONTRACT,
        "gpufleet.agent._violation",
        id="agent-imports-the-store",
    ),
    pytest.param(
        "services/provisioner/gpufleet/provisioner/_violation.py",
        "import sqlalchemy\n",
        DATABASE_CONTRACT,
        "gpufleet.provisioner._violation",
        id="provisioner-imports-sqlalchemy",
    ),
    # Indirect: the CLI imports a harmless-looking common module that reaches the store.
    pytest.param(
        "libs/cli/gpufleet/cli/_violation.py",
        "from gpufleet.common import convert\n",
        DATABASE_CONTRACT,
        "gpufleet.cli._violation",
        id="cli-reaches-the-store-indirectly",
    ),
]


@pytest.mark.parametrize(("path", "source", "contract", "importer"), VIOLATIONS)
def test_a_deliberate_violation_breaks_its_contract(
    tmp_path: Path, path: str, source: str, contract: str, importer: str
) -> None:
    copy_tree(tmp_path, ".importlinter", *PACKAGE_DIRS.values())
    (tmp_path / path).write_text(source)

    code, output = lint_imports(tmp_path)

    assert code != 0, output
    assert f"{contract} BROKEN" in output, output
    assert importer in output, output


# Distributions that are cloud SDKs (and their credential plumbing), and NVML's.
CLOUD_SDK = re.compile(
    r"^(google-cloud-.*|google-api-core|google-auth.*|boto3|botocore|aioboto.*"
    r"|aiobotocore|azure-.*|s3transfer)$"
)
NVML = re.compile(r"^(nvidia-ml-py.*|pynvml)$")
STORE = re.compile(r"^(sqlalchemy|alembic|psycopg.*)$")


def _pyprojects() -> dict[str, dict[str, object]]:
    return {rel: tomllib.loads((REPO / rel / "pyproject.toml").read_text()) for rel in PACKAGE_DIRS.values()}


def _requirements(project: dict[str, object], include_extras: bool) -> list[Requirement]:
    meta = project["project"]
    assert isinstance(meta, dict)
    reqs = [Requirement(r) for r in meta.get("dependencies", [])]
    if include_extras:
        for extra in meta.get("optional-dependencies", {}).values():
            reqs.extend(Requirement(r) for r in extra)
    return reqs


def _names(project: dict[str, object]) -> set[str]:
    return {r.name.lower().replace("_", "-") for r in _requirements(project, include_extras=True)}


def test_cloud_sdks_are_dependencies_of_the_provisioner_only() -> None:
    holders = {rel for rel, p in _pyprojects().items() if any(CLOUD_SDK.match(n) for n in _names(p))}
    assert holders == {"services/provisioner"}


def test_nvml_is_a_dependency_of_the_agent_only() -> None:
    holders = {rel for rel, p in _pyprojects().items() if any(NVML.match(n) for n in _names(p))}
    assert holders == {"services/agent"}


def test_only_the_store_services_install_the_store() -> None:
    store_users = set()
    for rel, project in _pyprojects().items():
        for req in _requirements(project, include_extras=False):
            name = req.name.lower()
            if STORE.match(name) or (name == "gpufleet-common" and "store" in req.extras):
                store_users.add(rel)
    assert store_users == {"services/scheduler", "services/reaper", "services/sweeper"}


# A setting that names cloud credentials or an identity in a cloud; only the provisioner may
# hold one (DESIGN.md §1: "the only cloud credentials").
CREDENTIAL_SETTING = re.compile(
    r"(aws|gcp|gce|google|boto|ec2|credential|access_key|secret_key|service_account|"
    r"application_default)"
)


@pytest.mark.parametrize(
    ("name", "flagged"),
    [
        ("aws_access_key_id", True),
        ("gcp_credentials_file", True),
        ("google_application_credentials", True),
        ("aws_profile", True),
        ("database_url", False),
        ("provisioner_address", False),
        ("rpc_timeout_s", False),
    ],
)
def test_the_credential_pattern_tells_credentials_from_plain_settings(name: str, flagged: bool) -> None:
    assert bool(CREDENTIAL_SETTING.search(name)) is flagged


@pytest.mark.parametrize("service", [s for s in SERVICES if s != "provisioner"])
def test_settings_outside_the_provisioner_hold_no_cloud_credentials(service: str) -> None:
    module = importlib.import_module(f"gpufleet.{service}.settings")
    fields = set(module.Settings.model_fields)
    assert "listen_address" in fields
    assert sorted(f for f in fields if CREDENTIAL_SETTING.search(f)) == []
