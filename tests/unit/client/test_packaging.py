"""The client is a library for someone else's application: its pins are ranges whose lower
bounds are what the generated code demands, it imports nothing of the server's code, and
scripts/bootstrap installs it."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[3]
CLIENT = REPO / "libs/client"
GENERATED = REPO / "protos/gpufleet/v1"


def requirements() -> dict[str, Requirement]:
    project = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    return {r.name: r for r in reqs}


def lower_bound(req: Requirement) -> Version:
    (low,) = [Version(s.version) for s in req.specifier if s.operator == ">="]
    return low


def test_every_pin_is_a_range_with_a_lower_bound() -> None:
    for req in requirements().values():
        assert not any(s.operator in ("==", "===", "~=") for s in req.specifier), req
        assert lower_bound(req), req


def test_grpcio_and_protobuf_bounds_are_what_the_generated_code_checks() -> None:
    reqs = requirements()
    grpc_versions = {
        Version(m)
        for f in GENERATED.glob("*_pb2_grpc.py")
        for m in re.findall(r"GRPC_GENERATED_VERSION = '([\d.]+)'", f.read_text())
    }
    gencode = {
        Version(".".join(m))
        for f in GENERATED.glob("*_pb2.py")
        for m in re.findall(r"Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", f.read_text())
    }
    assert grpc_versions and gencode
    assert lower_bound(reqs["grpcio"]) == max(grpc_versions)
    assert lower_bound(reqs["protobuf"]) == max(gencode)
    # The runtime refuses gencode of another major version.
    assert reqs["protobuf"].specifier.contains(f"{max(gencode).major}.999")
    assert not reqs["protobuf"].specifier.contains(f"{max(gencode).major + 1}.0.0")


def test_the_client_imports_nothing_of_the_servers_code() -> None:
    imported: set[str] = set()
    for path in (CLIENT / "gpufleet/client").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    ours = {m for m in imported if m.startswith("gpufleet")}
    assert ours and all(m.startswith(("gpufleet.client", "gpufleet.v1")) for m in ours), sorted(ours)


def test_bootstrap_installs_the_client() -> None:
    assert "-e libs/client" in (REPO / "scripts/bootstrap").read_text()
