"""The one storage client outside the provisioner stays in one module: the scheduler's
checkpoint bucket store imports obstore; no other module of any service may (its contract
in .importlinter bites on a deliberate violation), and only the scheduler depends on it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.quality._repo import PACKAGE_DIRS, REPO, copy_tree, run, tool

CONTRACT = "The object-store client (obstore) is imported only by the scheduler's checkpoint bucket"


def lint_imports(root: Path) -> tuple[int, str]:
    pythonpath = ":".join(str(root / d) for d in PACKAGE_DIRS.values())
    result = run([tool("lint-imports"), "--no-cache", "--no-logo"], cwd=root, env={"PYTHONPATH": pythonpath})
    # The report wraps long contract names: one space between words, whatever the width.
    return result.returncode, " ".join((result.stdout + result.stderr).split())


def test_the_tree_keeps_it() -> None:
    code, output = lint_imports(REPO)
    assert code == 0, output
    assert f"{CONTRACT} KEPT" in output, output


@pytest.mark.parametrize(
    ("path", "source", "importer"),
    [
        (
            "services/scheduler/gpufleet/scheduler/_violation.py",
            "from obstore.store import S3Store\n",
            "gpufleet.scheduler._violation",
        ),
        ("services/reaper/gpufleet/reaper/_violation.py", "import obstore\n", "gpufleet.reaper._violation"),
    ],
    ids=["scheduler-outside-the-bucket-store", "reaper"],
)
def test_another_module_importing_it_breaks_the_contract(
    tmp_path: Path, path: str, source: str, importer: str
) -> None:
    copy_tree(tmp_path, ".importlinter", *PACKAGE_DIRS.values())
    (tmp_path / path).write_text(source)

    code, output = lint_imports(tmp_path)

    assert code != 0, output
    assert f"{CONTRACT} BROKEN" in output, output
    assert importer in output, output


def test_only_the_scheduler_depends_on_it() -> None:
    holders = set()
    for rel in PACKAGE_DIRS.values():
        project = tomllib.loads((REPO / rel / "pyproject.toml").read_text())["project"]
        requirements = [*project.get("dependencies", [])]
        for extra in project.get("optional-dependencies", {}).values():
            requirements.extend(extra)
        if any(Requirement(r).name.lower() == "obstore" for r in requirements):
            holders.add(rel)
    assert holders == {"services/scheduler"}
