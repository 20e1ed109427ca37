"""docs/api.md, the API reference, is what the protos' comments render to (scripts/gen-api-doc),
shown to fail when a comment changes without regenerating; and it documents every method of
every service with who may call it."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpufleet.v1 import (
    agent_service_pb2,
    catalog_service_pb2,
    fleet_service_pb2,
    job_service_pb2,
    provisioner_service_pb2,
    reaper_service_pb2,
    sweeper_service_pb2,
    token_service_pb2,
    worker_service_pb2,
    workspace_service_pb2,
)
from tests.quality._repo import REPO, copy_tree, run

DOC = REPO / "docs" / "api.md"
MODULES = (
    agent_service_pb2,
    catalog_service_pb2,
    fleet_service_pb2,
    job_service_pb2,
    provisioner_service_pb2,
    reaper_service_pb2,
    sweeper_service_pb2,
    token_service_pb2,
    worker_service_pb2,
    workspace_service_pb2,
)


def check(protos: Path | None = None, doc: Path | None = None) -> tuple[int, str]:
    argv = [str(REPO / "scripts" / "gen-api-doc"), "--check"]
    if protos is not None:
        argv += [str(protos), str(doc or DOC)]
    result = run(argv)
    return result.returncode, result.stdout + result.stderr


def test_the_committed_reference_is_what_the_protos_render_to() -> None:
    code, output = check()
    assert code == 0, output


def test_the_check_fails_when_a_comment_changes_without_regenerating(tmp_path: Path) -> None:
    copy_tree(tmp_path, "protos")
    doc = tmp_path / "api.md"
    shutil.copy(DOC, doc)
    assert check(tmp_path / "protos", doc)[0] == 0  # an unchanged copy passes
    proto = tmp_path / "protos" / "gpufleet" / "v1" / "job_service.proto"
    text = proto.read_text()
    old, new = "  // One job with its attempts.\n", "  // One job, and each of its attempts.\n"
    assert old in text
    proto.write_text(text.replace(old, new))

    code, output = check(tmp_path / "protos", doc)

    assert code != 0
    assert "api.md is out of date" in output


def test_every_method_is_documented_with_its_callers() -> None:
    text = DOC.read_text()
    rows: dict[tuple[str, str], list[str]] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("### "):
            section = line.removeprefix("### ")
        elif line.startswith("| ") and section:
            cells = [c.strip() for c in line.split("|")]
            rows[(section, cells[1])] = cells
    for module in MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                cells = rows.get((service.name, method.name))
                assert cells is not None, f"{service.name}.{method.name} is not in docs/api.md"
                assert cells[4] and "nobody" not in cells[4], cells  # its callers
                assert cells[5], cells  # its description
    submit = rows[("JobService", "SubmitJob")]
    assert submit[4] == "backend, operator" and "defaults" in submit[5]
    assert rows[("CatalogService", "ListJobKinds")][4] == "backend, operator"
